"""Weight payloads through the Ray object store, as raw bytes (see ``transport.py``)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fp8rl.protocol import WeightUpdate
from fp8rl.workers.weight_sync.transport import Transport, dtype_of


class ObjectStoreTransport(Transport):
    """Each tensor becomes a uint8 numpy array of its bytes; the manifest restores dtype and shape."""

    name = "object_store"

    def send(self, payload: dict[str, Tensor]) -> dict[str, np.ndarray]:
        """Raw-byte arrays (CPU copies of device tensors)."""
        return {
            k: t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
            for k, t in payload.items()
        }

    def receive(
        self, update: WeightUpdate, handle: dict[str, np.ndarray], device: torch.device
    ) -> dict[str, Tensor]:
        """Tensors on ``device``; names missing from the manifest are passed through for validation
        to refuse; a byte count that does not match the manifest raises ValueError naming it."""
        entries = {e.name: e for e in update.tensors}
        out: dict[str, Tensor] = {}
        for name, raw in handle.items():
            entry = entries.get(name)
            flat = torch.from_numpy(np.array(raw, copy=True))
            if entry is None:
                out[name] = flat
                continue
            dtype = dtype_of(entry.dtype)
            expected = (
                int(np.prod(entry.shape, dtype=np.int64))
                * torch.empty((), dtype=dtype).element_size()
            )
            if flat.numel() != expected:
                raise ValueError(
                    f"{name}: payload has {flat.numel()} bytes, manifest {entry.shape} "
                    f"{entry.dtype} needs {expected}"
                )
            out[name] = flat.view(dtype).reshape(entry.shape).to(device)
        return out
