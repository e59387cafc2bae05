"""Megatron trainer checkpoints in the native trainer's format (``services/checkpoint.py``,
format 2): ``trainer/`` is a ``torch.distributed.checkpoint`` written by every rank together,
plus ``trainer/rank_<r>.pt`` per rank.

- ``model.<HF name>``: the full float32 masters in HF names (gathered over TP and PP, converted
  back from Megatron's layout), identical on every rank, so DCP stores each once. Export,
  ``read_model_weights`` and a native-trainer resume read them unchanged, and a Megatron resume
  at any TP × PP × DP reshards them (``load_hf_weights``).
- ``optim.tp<t>.pp<p>.<local parameter>.<exp_avg|exp_avg_sq|step>``: AdamW state of each
  (TP rank, PP stage) shard; DP replicas hold the same values and DCP stores them once. Restored
  only at the same TP × PP (another layout restarts AdamW, with a warning).
- ``rank_<r>.pt``: LR scheduler, policy version, RNG, the TP × PP × DP layout and AdamW's
  param groups.

Every function here is collective over the trainer group (all ranks, same directory).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from megatron.core import parallel_state
from torch import Tensor

from fp8rl.workers.model.build import DTYPES
from fp8rl.workers.trainer.megatron.convert import megatron_to_hf
from fp8rl.workers.trainer.megatron.publish import _all_stages, _dense_masters

DCP_DIR = "trainer"
"""The native trainer's DCP folder name (``workers.trainer.worker.DCP_DIR``)."""

log = logging.getLogger(__name__)


@torch.no_grad()
def hf_masters(model) -> dict[str, Tensor]:
    """The whole model's float32 masters in HF names, CPU (collective over TP and PP)."""
    masters = _all_stages(_dense_masters(model))
    return {k: v.cpu().clone() for k, v in megatron_to_hf(masters, model.fp8rl_config).items()}


def _prefix() -> str:
    return (
        f"tp{parallel_state.get_tensor_model_parallel_rank()}."
        f"pp{parallel_state.get_pipeline_model_parallel_rank()}."
    )


def _optim_state(model, optimizer: torch.optim.Optimizer) -> dict[str, Tensor]:
    """This shard's AdamW moments and step counts, keyed by (TP rank, PP stage, parameter)."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for param, state in optimizer.state.items():
        for key, value in state.items():
            tensor = value if isinstance(value, Tensor) else torch.tensor(value)
            out[f"{_prefix()}{names[id(param)]}.{key}"] = tensor.detach().cpu()
    return out


def save(trainer, directory: Path, *, optimizer: bool, weights_dtype: str) -> list[str]:
    """Write ``trainer``'s state under ``directory/trainer`` (see the module docstring).

    Args:
        trainer: a joined ``MegatronTrainer``. optimizer: include the AdamW moments.
        weights_dtype: stored dtype of the masters (``float32`` | ``bfloat16``).
    Returns:
        The paths this rank wrote, relative to ``directory``.
    """
    target = Path(directory) / DCP_DIR
    target.mkdir(parents=True, exist_ok=True)
    stored = DTYPES[weights_dtype]
    state: dict[str, Any] = {
        "model": {k: v.to(stored) for k, v in hf_masters(trainer.model).items()}
    }
    if optimizer:
        state["optim"] = _optim_state(trainer.model, trainer.optimizer)
    dcp.save(state, checkpoint_id=target)
    own = target / f"rank_{trainer.rank}.pt"
    layout = trainer.layout
    torch.save(
        {
            "scheduler": trainer.scheduler.state_dict(),
            "version": trainer.version,
            "world_size": layout.world,
            "layout": (layout.tp, layout.pp, layout.dp),
            "param_groups": trainer.optimizer.state_dict()["param_groups"],
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
        },
        own,
    )
    mine = sorted(p for p in target.glob(f"__{trainer.rank}_*") if p.is_file())
    if trainer.rank == 0:
        mine.append(target / ".metadata")
    return [str(p.relative_to(directory)) for p in [*mine, own]]


def load(trainer, directory: Path) -> int:
    """Restore ``save``'s state into ``trainer`` (weights at any layout; AdamW at the same TP ×
    PP); returns the policy version.

    Raises:
        FileNotFoundError: ``directory`` has no ``trainer/.metadata``.
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    source = Path(directory) / DCP_DIR
    if not (source / ".metadata").is_file():
        raise FileNotFoundError(f"{directory} has no trainer shards ({DCP_DIR}/.metadata)")
    saved_keys = dcp.FileSystemReader(source).read_metadata().state_dict_metadata
    weights = {
        k.removeprefix("model."): torch.empty(m.size, dtype=m.properties.dtype)
        for k, m in saved_keys.items()
        if k.startswith("model.") and isinstance(m, TensorStorageMetadata)
    }
    own = source / f"rank_{trainer.rank}.pt"
    ranks = sorted(source.glob("rank_*.pt"))
    rank_state = torch.load(own if own.is_file() else ranks[0], weights_only=False)
    layout = (trainer.layout.tp, trainer.layout.pp, trainer.layout.dp)
    same_shards = tuple(rank_state.get("layout", ()))[:2] == layout[:2]
    optim = _empty_optim(trainer, saved_keys) if same_shards else {}
    state = {"model": weights} | ({"optim": optim} if optim else {})
    dcp.load(state, checkpoint_id=source)
    from fp8rl.workers.trainer.megatron.model import load_hf_weights

    load_hf_weights(trainer.model, weights)
    if optim:
        _set_optim(trainer, state["optim"], rank_state["param_groups"])
    else:
        log.warning(
            "%s: no AdamW state for TP×PP %s (saved at %s, or save_optimizer=false): AdamW "
            "restarts",
            directory,
            layout[:2],
            tuple(rank_state.get("layout", ()))[:2],
        )
    trainer.scheduler.load_state_dict(rank_state["scheduler"])
    trainer.version = int(rank_state["version"])
    torch.set_rng_state(rank_state["rng"]["torch"])
    if rank_state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rank_state["rng"]["cuda"])
    return trainer.version


def _empty_optim(trainer, saved_keys) -> dict[str, Tensor]:
    """Destination tensors (saved shape and dtype) for this shard's saved AdamW entries."""
    out = {}
    for name, _ in trainer.model.named_parameters():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            full = f"{_prefix()}{name}.{key}"
            meta = saved_keys.get(f"optim.{full}")
            if meta is not None:
                out[full] = torch.empty(meta.size, dtype=meta.properties.dtype)
    return out


def _set_optim(trainer, flat: dict[str, Tensor], param_groups: list[dict]) -> None:
    """Rebuild AdamW's state dict (parameter indices in ``model.parameters()`` order)."""
    prefix, device = _prefix(), trainer.device
    state = {}
    for index, (name, _) in enumerate(trainer.model.named_parameters()):
        entry = {
            key: flat[f"{prefix}{name}.{key}"]
            for key in ("exp_avg", "exp_avg_sq", "step")
            if f"{prefix}{name}.{key}" in flat
        }
        if entry:
            state[index] = {k: (v if k == "step" else v.to(device)) for k, v in entry.items()}
    trainer.optimizer.load_state_dict({"state": state, "param_groups": param_groups})
