"""The receiving side of weight sync, shared by every engine and the reference worker.

A ``WeightReceiver`` knows the transports its worker has joined, the quant contract it holds
(fingerprint, scale format) and the version it last applied. ``accept`` receives a payload and
validates it completely (``validate_update``); only then does the worker write it and ``commit``
the version — so a refused update leaves weights and version untouched.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from fp8rl.protocol import WeightUpdate
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.weight_sync.layout import SlotSpec, engine_slots, engine_tensor
from fp8rl.workers.weight_sync.transport import Transport, make_transport
from fp8rl.workers.weight_sync.update import WeightUpdateRefused, validate_update


class WeightReceiver:
    """Transports, quant contract and applied version of one receiving worker.

    Args:
        precision: the worker's layer precision (FP8 or not, scale format).
        fingerprint: its QuantConfig fingerprint (None when it runs no FP8).
    """

    def __init__(self, precision: LayerPrecision, fingerprint: str | None) -> None:
        self.transports: dict[str, Transport] = {"object_store": make_transport("object_store")}
        self.fingerprint = fingerprint
        self.scale_format = precision.quant.scale_format if precision.fp8 else None
        self.version: int | None = None  # None until the first update is applied

    def join(self, name: str, **kwargs: Any) -> None:
        """Receive through transport ``name`` too (``nccl`` joins its process group)."""
        self.transports[name] = make_transport(name, **kwargs)

    def accept(
        self, update: WeightUpdate, handle: Any, *, slots: dict[str, SlotSpec], device: torch.device
    ) -> dict[str, Tensor]:
        """Receive the payload and validate everything against ``slots``; write nothing.

        Raises:
            ValueError: the update came over a transport this worker has not joined.
            WeightUpdateRefused: one line per bad tensor or field.
        """
        if update.transport not in self.transports:
            raise ValueError(
                f"weight update sent over {update.transport}, which this worker has not joined"
            )
        payload = self.transports[update.transport].receive(update, handle, device)
        problems = validate_update(
            update,
            payload,
            slots=slots,
            current_version=self.version,
            fingerprint=self.fingerprint,
            scale_format=self.scale_format,
        )
        if problems:
            raise WeightUpdateRefused(problems)
        return payload

    def apply(
        self, model: nn.Module, update: WeightUpdate, handle: Any, *, device: torch.device
    ) -> int:
        """Accept, copy into the shared-decoder ``model`` in place, commit; return the version."""
        slots = engine_slots(model)
        payload = self.accept(update, handle, slots=slots, device=device)
        with torch.no_grad():
            for name in slots:
                engine_tensor(model, name).copy_(payload[name])
        self.version = update.version
        return update.version
