"""Weight payloads handed over inside one process (``resources.hybrid_engine``; see ``transport.py``).

The trainer and the native engine of a hybrid worker share a process, so the payload needs no
copy through Ray's object store: ``send`` parks the tensors under a one-time token, the driver
forwards the token with the manifest, and ``receive`` takes them back. The receiver still
validates everything before it writes (``WeightReceiver.accept``).
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from fp8rl.protocol import WeightUpdate
from fp8rl.workers.weight_sync.transport import Transport

_PARKED: dict[str, dict[str, Tensor]] = {}
_TOKENS = itertools.count()


class LocalTransport(Transport):
    """Tensors parked in this process under a token; each payload can be received once."""

    name = "local"

    def send(self, payload: dict[str, Tensor]) -> str:
        """Park ``payload`` (no copy; the last unclaimed payload is dropped); return its token."""
        _PARKED.clear()  # a refused or abandoned update is not kept alive beside the next one
        token = f"local-{next(_TOKENS)}"
        _PARKED[token] = dict(payload)
        return token

    def receive(self, update: WeightUpdate, handle: str, device: torch.device) -> dict[str, Tensor]:
        """The parked tensors on ``device``.

        Raises:
            ValueError: no payload is parked under ``handle`` in this process (the sender is
                another process, or the payload was already received or replaced).
        """
        payload = _PARKED.pop(handle, None)
        if payload is None:
            raise ValueError(
                f"no weight payload {handle!r} in this process: the local transport only joins "
                "a trainer and an engine of one process (resources.hybrid_engine)"
            )
        return {name: t.to(device) for name, t in payload.items()}
