"""The sending side of weight sync, beside ``receiver.WeightReceiver``.

A ``WeightPublisher`` belongs to one trainer rank. It knows the transports that rank has joined
(only rank 0 of a sharded trainer sends; the others take part in the gathers only), builds the
update in the receiver's layout (``update.build_update``: quantize once, 128×128, the rollout's
quantizer) and hands the payload to the transport. The driver never names a transport:
``services.weights.sync_weights`` calls ``publish`` on every rank and ``apply_weights`` on every
engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from fp8rl.protocol import WeightUpdate
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.weight_sync.transport import Transport, make_transport
from fp8rl.workers.weight_sync.update import build_update


class WeightPublisher:
    """Transports and the pending NCCL payload of one trainer rank.

    Args:
        rank: the trainer rank (only rank 0 sends).
    """

    def __init__(self, rank: int = 0) -> None:
        self.rank = rank
        self.transports: dict[str, Transport] = {"object_store": make_transport("object_store")}
        self.transport = "object_store"  # engines' transport; the reference uses the object store
        self._pending: dict[str, Tensor] | None = None

    def join(self, name: str, **kwargs: Any) -> None:
        """Send rollout updates through transport ``name`` (``nccl`` joins its own group)."""
        self.transports[name] = make_transport(name, **kwargs)
        self.transport = name

    def publish(
        self,
        model: nn.Module,
        *,
        receiver: LayerPrecision,
        version: int,
        fingerprint: str | None,
        role: str = "rollout",
        gather: Callable[[Tensor], Tensor | None] | None = None,
    ) -> tuple[WeightUpdate | None, Any]:
        """Build and send the update; return ``(manifest, transport handle)``.

        ``gather`` (sharded trainers): see ``build_update``; every rank calls ``publish``, ranks
        other than 0 return ``(None, None)``. Over NCCL the handle is None and the payload waits
        for ``broadcast`` (the receivers need the manifest first).
        """
        transport = self.transports[self.transport if role == "rollout" else "object_store"]
        update, payload = build_update(
            model,
            receiver=receiver,
            version=version,
            fingerprint=fingerprint,
            transport=transport.name,
            gather=gather,
        )
        if self.rank != 0:
            return None, None
        if transport.name == "nccl":
            self._pending = payload
            return update, None
        return update, transport.send(payload)

    def broadcast(self) -> None:
        """Send the last published payload over the NCCL group (engines receive concurrently).

        Raises:
            RuntimeError: nothing was published since the last broadcast.
        """
        if self._pending is None:
            raise RuntimeError("broadcast without a published NCCL update")
        payload, self._pending = self._pending, None
        self.transports["nccl"].send(payload)
