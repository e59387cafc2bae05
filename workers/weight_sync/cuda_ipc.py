"""Weight payloads between processes on the same GPU through CUDA IPC handles.

The trainer keeps the sent tensors alive until its next ``send`` (the receivers copy out of the
shared memory while validating/applying). Only for colocated placement: sender and receivers
must see the same physical device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.multiprocessing.reductions import reduce_tensor

from fp8rl.protocol import WeightUpdate
from fp8rl.workers.weight_sync.transport import Transport


class CudaIpcTransport(Transport):
    """``reduce_tensor`` handles out, ``rebuild`` + clone in."""

    name = "cuda_ipc"

    def __init__(self) -> None:
        self._alive: dict[str, Tensor] = {}

    def send(self, payload: dict[str, Tensor]) -> dict[str, Any]:
        """IPC handles of CUDA tensors. Raises ValueError for CPU tensors."""
        cpu = [k for k, t in payload.items() if not t.is_cuda]
        if cpu:
            raise ValueError(f"cuda_ipc needs CUDA tensors; on CPU: {cpu[:3]}")
        self._alive = {k: t.detach().contiguous() for k, t in payload.items()}
        return {k: reduce_tensor(t) for k, t in self._alive.items()}

    def receive(
        self, update: WeightUpdate, handle: dict[str, Any], device: torch.device
    ) -> dict[str, Tensor]:
        """Clones on ``device`` of the sender's tensors."""
        out = {}
        for name, (rebuild, args) in handle.items():
            shared = rebuild(*args)
            out[name] = shared.to(device, copy=True)
        return out
