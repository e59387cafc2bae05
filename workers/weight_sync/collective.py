"""Weight payloads by torch.distributed broadcast: NCCL across GPUs, gloo on CPU.

The trainer is rank 0 of a process group that holds it and every engine. Tensors are broadcast
in manifest order as raw bytes (dtype-agnostic: float8 and bfloat16 go through gloo too), packed
into buckets of at most ``BUCKET_BYTES`` (one broadcast each; sender and receivers derive the same
buckets from the manifest); each receiver allocates staging buffers from the manifest, receives,
then validates before writing.

The group is its own (a ``TCPStore`` + a gloo/NCCL process group object), never the default
group, so a sharded trainer's FSDP group and the weight-sync group coexist in one process.
"""

from __future__ import annotations

import datetime
from typing import Any

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
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = _store(init_method, rank, world_size, timeout)
        if backend == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.group = dist.ProcessGroupNCCL(self.store, rank, world_size)
        else:
            self.device = torch.device("cpu")
            self.group = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)

    def send(self, payload: dict[str, Tensor]) -> None:
        """Broadcast every tensor (rank 0), bucket by bucket; the manifest carries names and
        shapes to the receivers."""
        tensors = list(payload.values())
        for bucket in buckets([t.numel() * t.element_size() for t in tensors]):
            flat = torch.cat([_as_bytes(tensors[i].to(self.device)) for i in bucket])
            self._broadcast(flat)

    def receive(
        self, update: WeightUpdate, handle: None, device: torch.device
    ) -> dict[str, Tensor]:
        """Receive the broadcast into buffers shaped by the manifest, in manifest order."""
        entries = update.tensors
        bufs = [torch.empty(e.shape, dtype=dtype_of(e.dtype), device=self.device) for e in entries]
        out = {}
        for bucket in buckets([b.numel() * b.element_size() for b in bufs]):
            flat = torch.empty(
                sum(bufs[i].numel() * bufs[i].element_size() for i in bucket),
                dtype=torch.uint8,
                device=self.device,
            )
            self._broadcast(flat)
            offset = 0
            for i in bucket:
                size = bufs[i].numel() * bufs[i].element_size()
                _as_bytes(bufs[i]).copy_(flat[offset : offset + size])
                offset += size
                out[entries[i].name] = bufs[i].to(device)
        return out

    def _broadcast(self, flat: Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([flat], opts).wait()

    def close(self) -> None:
        """Leave the weight-sync group."""
        self.group = None


def _store(init_method: str, rank: int, world_size: int, timeout: datetime.timedelta) -> Any:
    """The rendezvous store of ``tcp://host:port`` (rank 0 hosts it) or ``file:///path``."""
    if init_method.startswith("file://"):
        return dist.FileStore(init_method.removeprefix("file://"), world_size)
    host, _, port = init_method.removeprefix("tcp://").rpartition(":")
    return dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout)


BUCKET_BYTES = 512 * 2**20
"""Most bytes per broadcast (a tensor larger than this goes alone)."""


def buckets(sizes: list[int], limit: int = BUCKET_BYTES) -> list[list[int]]:
    """Consecutive indices of ``sizes`` grouped so each group's total is at most ``limit``
    (a single larger item forms its own group). Pure; sender and receivers agree on it."""
    out: list[list[int]] = []
    total = limit + 1
    for i, size in enumerate(sizes):
        if out and total + size <= limit:
            out[-1].append(i)
            total += size
        else:
            out.append([i])
            total = size
    return out


def _as_bytes(tensor: Tensor) -> Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)
