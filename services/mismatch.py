"""Measure rollout↔trainer mismatch for the three precision modes on the same prompts.

For each mode the engine (rollout precision) samples responses; a trainer-precision copy of the
same weights scores exactly those token ids through the trainer's forward. DESIGN.md §6 metrics
compare the two logprobs per response token. Both models are built from the same source weights,
so in ``fp8_rollout`` the engine's FP8 codes come from the trainer's weights, as in a real run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from fp8rl.protocol import ModelSpec, PrecisionSpec, SamplingParams
from fp8rl.workers.algorithms import mismatch_by_position, mismatch_metrics
from fp8rl.workers.common import load_model
from fp8rl.workers.model.loading import ModelSource
from fp8rl.workers.model.scoring import pack, response_logprobs
from fp8rl.workers.rollout.engine import NativeEngine

MODES = ("bf16", "fp8_rollout", "unified_fp8")


@dataclass
class ModeReport:
    """Mismatch of one precision mode: DESIGN.md §6 metrics plus the per-position curve."""

    mode: str
    metrics: dict[str, float]
    by_position: list[float]
    num_tokens: int


def measure_mode(
    source: ModelSource,
    model: ModelSpec,
    precision: PrecisionSpec,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingParams,
    *,
    device: torch.device,
    batch_size: int = 16,
    on_phase: Callable[[str], None] | None = None,
) -> ModeReport:
    """Generate with the engine, score with the trainer forward, compare (one mode).

    ``on_phase`` is called with ``"loading"``, ``"generating"`` and ``"scoring"`` as each
    phase starts (progress output).
    """
    phase = on_phase or (lambda _: None)
    phase("loading")
    engine_model, _ = load_model(
        model, precision, role="rollout", trainable=False, device=device, seed=0, source=source
    )
    trainer_model, _ = load_model(
        model, precision, role="trainer", trainable=False, device=device, seed=0, source=source
    )
    return compare(
        precision.mode, engine_model, trainer_model, source, prompts, sampling,
        device=device, batch_size=batch_size, on_phase=phase,
    )  # fmt: skip


def compare(
    name: str,
    engine_model: torch.nn.Module,
    trainer_model: torch.nn.Module,
    source: ModelSource,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingParams,
    *,
    device: torch.device,
    batch_size: int = 16,
    on_phase: Callable[[str], None] | None = None,
) -> ModeReport:
    """Sample with ``engine_model``, score the same token ids with ``trainer_model``, compare.

    Returns the DESIGN.md §6 metrics under ``name``; ``on_phase`` is called with
    ``"generating"`` and ``"scoring"``.
    """
    phase = on_phase or (lambda _: None)
    engine = NativeEngine(
        engine_model, eos_token_ids=source.config.eos_token_id, max_batch_size=batch_size
    )
    phase("generating")
    groups = engine.generate(prompts, sampling)
    phase("scoring")
    samples = [(p, g) for p, gs in zip(prompts, groups, strict=True) for g in gs]
    batch = pack([p for p, _ in samples], [g.token_ids for _, g in samples])
    rollout = torch.zeros(batch.response_ids.shape, dtype=torch.float32)
    for i, (_, g) in enumerate(samples):
        rollout[i, : len(g.logprobs)] = torch.tensor(g.logprobs)
    with torch.inference_mode():
        chunks = [
            batch.select(slice(s, s + batch_size)).to(device)
            for s in range(0, len(samples), batch_size)
        ]
        width = batch.response_ids.shape[1]
        train = torch.cat(
            [
                _pad(
                    response_logprobs(trainer_model, c, temperature=sampling.temperature).cpu(),
                    width,
                )
                for c in chunks
            ]
        )
    mask = batch.response_mask
    return ModeReport(
        name,
        mismatch_metrics(train, rollout, mask),
        [float(v) for v in mismatch_by_position(train, rollout, mask)],
        int(mask.sum()),
    )


def _pad(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))
