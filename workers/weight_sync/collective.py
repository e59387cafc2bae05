"""Weight payloads by torch.distributed broadcast: NCCL across GPUs, gloo on CPU.

The trainer is rank 0 of a process group that holds it and every engine. Tensors are broadcast
in manifest order as raw bytes (dtype-agnostic: float8 and bfloat16 go through gloo too); each
receiver allocates staging buffers from the manifest, receives, then validates before writing.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch import Tensor

from fp8rl.protocol import WeightUpdate
from fp8rl.workers.weight_sync.transport import Transport, dtype_of


class CollectiveTransport(Transport):
    """Broadcast from rank 0. Args: init_method (``tcp://host:port``), rank, world_size, backend."""

    name = "nccl"

    def __init__(
        self,
        *,
        init_method: str,
        rank: int,
        world_size: int,
        backend: str = "nccl",
        timeout_s: float = 600.0,
    ) -> None:
        self.rank, self.backend = rank, backend
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )

    def send(self, payload: dict[str, Tensor]) -> None:
        """Broadcast every tensor (rank 0); the manifest carries names/shapes to the receivers."""
        for tensor in payload.values():
            dist.broadcast(_as_bytes(tensor.to(self.device)), src=0)

    def receive(
        self, update: WeightUpdate, handle: None, device: torch.device
    ) -> dict[str, Tensor]:
        """Receive the broadcast into buffers shaped by the manifest, in manifest order."""
        out = {}
        for entry in update.tensors:
            dtype = dtype_of(entry.dtype)
            buf = torch.empty(entry.shape, dtype=dtype, device=self.device)
            dist.broadcast(_as_bytes(buf), src=0)
            out[entry.name] = buf.to(device)
        return out

    def close(self) -> None:
        """Leave the process group."""
        if dist.is_initialized():
            dist.destroy_process_group()


def _as_bytes(tensor: Tensor) -> Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)
