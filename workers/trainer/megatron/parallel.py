"""Process groups for a Megatron trainer rank: torch.distributed + Megatron's parallel state.

Ray actors (one per rank) call ``init_parallel`` with the same rendezvous address; tests call it
from ``torch.multiprocessing`` workers. ``gloo`` on CPU, ``nccl`` on CUDA.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from fp8rl.workers.trainer.megatron.layout import ParallelLayout


def init_parallel(
    *,
    rank: int,
    world: int,
    tp: int,
    pp: int,
    address: str = "127.0.0.1",
    port: int | None = None,
    init_method: str | None = None,
    backend: str | None = None,
) -> ParallelLayout:
    """Join the process group and build Megatron's TP/PP/DP groups (tp-dp-pp rank order).

    Args:
        rank, world: this rank and the number of ranks (= TP × PP × DP).
        init_method: ``tcp://host:port`` of rank 0's TCP store; else ``address`` and ``port``.
        backend: ``gloo``/``nccl``; default ``nccl`` when CUDA is available, else ``gloo``.
    Returns:
        The ParallelLayout.
    Raises:
        ValueError: TP·PP does not divide ``world``, or neither ``init_method`` nor ``port``.
    """
    layout = ParallelLayout.from_world(world, tp=tp, pp=pp)
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if init_method is None:
        if port is None:
            raise ValueError("init_parallel needs init_method or a port")
        init_method = f"tcp://{address}:{port}"
    if not dist.is_initialized():
        host, _, tcp_port = init_method.removeprefix("tcp://").rpartition(":")
        os.environ.setdefault("MASTER_ADDR", host)
        os.environ.setdefault("MASTER_PORT", tcp_port)
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
        )
    return layout


def shutdown_parallel() -> None:
    """Destroy Megatron's groups and the default process group (idempotent)."""
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def tp_coords() -> tuple[int, int]:
    """``(tp_rank, tp_size)`` of this rank."""
    return (
        parallel_state.get_tensor_model_parallel_rank(),
        parallel_state.get_tensor_model_parallel_world_size(),
    )
