"""Mismatch attribution (DESIGN.md §6): how much of the FP8-rollout mismatch each FP8
ingredient causes on its own.

Against one BF16 trainer (exact kernels, the ``fp8_rollout`` trainer), a BF16 engine with one
ingredient switched on (``workers.model.precision_variants``: weight quantization, activation
quantization, the FP8 KV cache, fast kernels) samples responses that the trainer scores. Each
ingredient's share is its ``mismatch/kl_k3`` over the sum of the four (the KL is additive for
small independent perturbations; the full FP8 engine is measured too, so the sum of the parts
can be compared with the whole).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from fp8rl.protocol import JobSpec, ModelSpec, PrecisionSpec, SamplingParams
from fp8rl.services.mismatch import ModeReport, compare
from fp8rl.workers.common import load_model
from fp8rl.workers.model.build import build_decoder, layer_precision
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.model.loading import ModelSource
from fp8rl.workers.model.precision_variants import VARIANTS, build_variant, calibrate_kv_scales

SHARE_METRIC = "mismatch/kl_k3"


def shares(reports: Sequence[ModeReport]) -> dict[str, float]:
    """Each report's fraction of the summed ``mismatch/kl_k3`` (all 0 when the sum is 0)."""
    values = {r.mode: max(0.0, r.metrics[SHARE_METRIC]) for r in reports}
    total = sum(values.values())
    return {k: (v / total if total > 0 else 0.0) for k, v in values.items()}


def random_weights(source: ModelSource, max_positions: int) -> dict[str, torch.Tensor]:
    """float32 parameters of the seed-0 random decoder of ``source.config``."""
    model = build_decoder(
        source.config,
        LayerPrecision(dtype=torch.float32),
        state_dict=None,
        max_positions=max_positions,
        param_dtype=torch.float32,
        seed=0,
    )
    return {k: v.detach() for k, v in model.named_parameters()}


def attribute(
    source: ModelSource,
    model: ModelSpec,
    precision: PrecisionSpec,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingParams,
    *,
    device: torch.device,
    variants: Sequence[str] = VARIANTS,
    on_report: Callable[[ModeReport], None] | None = None,
    on_phase: Callable[[str, str], None] | None = None,
) -> list[ModeReport]:
    """The mismatch of each ingredient alone, then of the FP8 engine with all four on
    (``fp8_all``: FP8 weights and activations, FP8 KV cache, fast kernels).

    ``precision``: its QuantConfig (and KV cache dtype) defines the FP8 recipe; ``exact`` the
    trainer's kernels. ``on_report`` gets each report as soon as it is measured (streaming).
    """
    if source.state_dict is None:  # a random:PRESET model: fix its seed-0 weights once
        source = replace(source, state_dict=random_weights(source, model.max_model_len))
    fp8_rollout = precision.model_copy(update={"mode": "fp8_rollout"})
    bf16 = layer_precision(model, fp8_rollout, role="trainer", trainable=False)
    fp8 = layer_precision(model, fp8_rollout, role="rollout", trainable=False)
    trainer, _ = load_model(
        model, fp8_rollout, role="trainer", trainable=False, device=device, seed=0, source=source
    )
    reports = []
    for variant in variants:
        if on_phase:
            on_phase(variant, "loading")
        engine = build_variant(
            variant, source.config, source.state_dict, bf16=bf16, fp8=fp8, prompts=prompts,
            max_positions=model.max_model_len, device=device,
        )  # fmt: skip
        report = compare(
            variant, engine, trainer, source, prompts, sampling, device=device,
            on_phase=(lambda p, v=variant: on_phase(v, p)) if on_phase else None,
        )  # fmt: skip
        reports.append(report)
        if on_report:
            on_report(report)
    if on_phase:
        on_phase("fp8_all", "loading")
    everything = fp8_rollout.model_copy(
        update={
            "exact": False,
            "quant": fp8_rollout.quant.model_copy(update={"kv_cache_dtype": "fp8_e4m3"}),
        }
    )
    full, _ = load_model(
        model, everything, role="rollout", trainable=False, device=device, seed=0, source=source
    )
    calibrate_kv_scales(full, prompts)
    report = compare("fp8_all", full, trainer, source, prompts, sampling, device=device)
    reports.append(report)
    if on_report:
        on_report(report)
    return reports


ATTRIBUTION_PROMPTS = 2
"""Prompts of the step that training-time attribution measures (2 samples each)."""


def attribution_due(every: int, step: int) -> bool:
    """Whether step ``step`` (1-based) measures attribution under ``logging.mismatch_attribution_every``."""
    return every > 0 and step % every == 0


def attribution_metrics(
    job: JobSpec, weights: dict[str, torch.Tensor], prompts: Sequence[Sequence[int]], *, step: int
) -> dict[str, float]:
    """``mismatch/attrib/*`` of the policy ``weights`` (HF names) on ``prompts``.

    ``mismatch/attrib/<ingredient>`` is that ingredient's kl_k3 alone, ``…/<ingredient>_share``
    its fraction of their sum, ``mismatch/attrib/fp8_all`` the kl_k3 of all four together.
    """
    from fp8rl.workers.model.fp8_checkpoint import is_kv_scale
    from fp8rl.workers.model.loading import resolve_model

    source = replace(
        resolve_model(job.model.path, load_weights=False),
        state_dict={k: v.float() for k, v in weights.items() if not is_kv_scale(k)},
    )
    sampling = SamplingParams(
        n=2, temperature=job.rollout.temperature, max_tokens=job.rollout.max_tokens,
        seed=job.seed * 100003 + step,
    )  # fmt: skip
    reports = attribute(
        source, job.model, job.precision, prompts[:ATTRIBUTION_PROMPTS], sampling,
        device=torch.device("cpu"),
    )  # fmt: skip
    out = {f"mismatch/attrib/{r.mode}": r.metrics[SHARE_METRIC] for r in reports}
    parts = [r for r in reports if r.mode != "fp8_all"]
    out |= {f"mismatch/attrib/{k}_share": v for k, v in shares(parts).items()}
    return out
