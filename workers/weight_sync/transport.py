"""How a weight update's payload travels: a tiny interface, one module per implementation.

- ``object_store`` (``ObjectStoreTransport``): tensors as raw-byte numpy arrays through Ray's
  object store — zero-copy reads on the receiving node, any device, any dtype (float8 and bfloat16
  have no pickle-safe path through Ray's tensor serializer, raw bytes do).
- ``cuda_ipc`` (``CudaIpcTransport``): CUDA IPC handles for engines colocated on the trainer's GPU.
- ``nccl`` (``CollectiveTransport``): a torch.distributed broadcast from the trainer to every
  engine (NCCL on GPUs, gloo on CPU for tests).
- ``local`` (``LocalTransport``): the tensors themselves, for a trainer and an engine that share
  one process (``resources.hybrid_engine``).

The manifest (``WeightUpdate``) always travels through Ray as a typed message; receivers rebuild
tensors from it and validate before writing anything.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor

from fp8rl.protocol import WeightUpdate

DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (torch.float8_e4m3fn, torch.float32, torch.bfloat16, torch.float16)
}


class Transport(ABC):
    """Moves a payload ``{name: tensor}`` from the trainer to the engines."""

    name: str

    @abstractmethod
    def send(self, payload: dict[str, Tensor]) -> Any:
        """Sender side: return the handle the driver forwards to receivers (with the manifest)."""

    @abstractmethod
    def receive(self, update: WeightUpdate, handle: Any, device: torch.device) -> dict[str, Tensor]:
        """Receiver side: the payload as tensors on ``device`` (staging copies, not the model's)."""


def dtype_of(name: str) -> torch.dtype:
    """torch dtype from a manifest dtype name (``float8_e4m3fn``)."""
    if name not in DTYPES:
        raise ValueError(f"unsupported tensor dtype {name!r} in weight update")
    return DTYPES[name]


def make_transport(name: str, **kwargs: Any) -> Transport:
    """The transport called ``name`` (object_store | cuda_ipc | nccl | local)."""
    if name == "object_store":
        from fp8rl.workers.weight_sync.object_store import ObjectStoreTransport

        return ObjectStoreTransport()
    if name == "cuda_ipc":
        from fp8rl.workers.weight_sync.cuda_ipc import CudaIpcTransport

        return CudaIpcTransport()
    if name == "nccl":
        from fp8rl.workers.weight_sync.collective import CollectiveTransport

        return CollectiveTransport(**kwargs)
    if name == "local":
        from fp8rl.workers.weight_sync.local import LocalTransport

        return LocalTransport()
    raise ValueError(
        f"unknown weight transport {name!r}; use object_store, cuda_ipc, nccl or local"
    )
