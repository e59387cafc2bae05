"""Model + optimizer state of one rank as ``torch.distributed.checkpoint`` shards.

Shared by the policy trainer (``trainer/``) and the critic (``critic/``): every rank of a
sharded model writes its own shards; rank 0 writes the ``.metadata``. A load reshards to the
rank count of the reading group, so a resume may use another ``num_workers``.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from fp8rl.workers.model.build import DTYPES

log = logging.getLogger(__name__)


@contextlib.contextmanager
def single_process_io() -> Iterator[None]:
    """Silence ``torch.distributed.checkpoint``'s UserWarning that a save/load without a process
    group runs in one process: fp8rl asks for exactly that (``no_dist``), and the warning reached
    every run's, resume's and export's console."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def save_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    target: Path,
    *,
    rank: int,
    optimizer_state: bool = True,
    weights_dtype: str = "float32",
) -> list[Path]:
    """Write this rank's shards of ``model``'s weights (and AdamW moments) under ``target``.

    Args:
        optimizer_state: False leaves the AdamW moments out (``checkpoint.save_optimizer``).
        weights_dtype: stored dtype of floating weights (``float32`` | ``bfloat16``); they load
            back into the model's dtype.
    Collective over the model's process group (every rank, same ``target``). Returns the files
    this rank wrote (rank 0 also owns ``.metadata``).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    target.mkdir(parents=True, exist_ok=True)
    model_state, optim_state = get_state_dict(model, optimizer)
    if weights_dtype != "float32":
        stored = DTYPES[weights_dtype]
        model_state = {
            k: v.to(stored) if v.is_floating_point() else v for k, v in model_state.items()
        }
    with single_process_io():
        dcp.save(
            {"model": model_state} | ({"optim": optim_state} if optimizer_state else {}),
            checkpoint_id=target,
            no_dist=not dist.is_initialized(),
        )
    mine = sorted(p for p in target.glob(f"__{rank}_*") if p.is_file())
    return [*mine, target / ".metadata"] if rank == 0 else mine


def load_state(model: nn.Module, optimizer: torch.optim.Optimizer, source: Path) -> bool:
    """Load what ``save_state`` wrote under ``source`` into ``model`` (and ``optimizer`` when the
    moments were saved); return whether they were.

    Raises:
        FileNotFoundError: ``source`` holds no shards (``.metadata`` missing).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    if not (source / ".metadata").is_file():
        raise FileNotFoundError(f"{source.parent} has no {source.name}/ shards (.metadata)")
    model_state, optim_state = get_state_dict(model, optimizer)
    saved_keys = dcp.FileSystemReader(source).read_metadata().state_dict_metadata
    with_optimizer = any(key.startswith("optim.") for key in saved_keys)
    state = {"model": model_state} | ({"optim": optim_state} if with_optimizer else {})
    with single_process_io():
        dcp.load(state, checkpoint_id=source, no_dist=not dist.is_initialized())
    if with_optimizer:
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
    else:
        set_model_state_dict(model, state["model"])
        log.warning("%s has no optimizer state (save_optimizer=false): AdamW restarts", source)
    return with_optimizer
