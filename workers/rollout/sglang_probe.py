"""KV-scale read-back inside SGLang's scheduler processes (a registered custom weight loader).

SGLang 0.5.23 offers no public read of a scalar parameter: ``Engine.get_weights_by_name`` slices
``tolist()`` of the tensor, which fails (and returns None) for the 0-d ``attn.k_scale``, and its
weight checker skips KV scales (``_skip_weight_check``). So fp8rl registers this function as a
``custom_weight_loader`` and, after ``end_weight_update``, calls
``update_weights_from_tensor(load_format=PROBE_LOADER)`` inside its own short session: SGLang
calls ``read_kv_scales(model, named_tensors)`` on every TP rank, which writes nothing to the model
and records the current values of the named parameters in ``$FP8RL_SGLANG_PROBE_DIR``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

PROBE_DIR_ENV = "FP8RL_SGLANG_PROBE_DIR"


def probe_file(directory: str | Path, rank: int) -> Path:
    """The JSON file TP rank ``rank`` writes."""
    return Path(directory) / f"kv-scales-rank{rank}.json"


def read_kv_scales(model: Any, named_tensors: list[tuple[str, Any]]) -> None:
    """Record ``{name: float(model.get_parameter(name))}`` for each named parameter (the tensors
    themselves are ignored); write nothing into the model. Missing parameters record None."""
    import torch

    values: dict[str, float | None] = {}
    for name, _ in named_tensors:
        try:
            values[name] = float(model.get_parameter(name).detach().float().cpu())
        except AttributeError:
            values[name] = None
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    path = probe_file(os.environ[PROBE_DIR_ENV], rank)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(values))
    tmp.replace(path)


__all__ = ["PROBE_DIR_ENV", "probe_file", "read_kv_scales"]
