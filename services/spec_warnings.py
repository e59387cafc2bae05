"""Flag combinations that run but can silently stop learning (warnings, not refusals).

``fp8rl validate`` prints them and the driver logs them when a run starts. Each is one
``dotted.field: why`` line.

BF16 master weights with a small learning rate: BF16 keeps 8 significant bits, so a weight w in
[2^e, 2^(e+1)) moves only when the update is at least half its spacing, 2^(e-8). AdamW's update
is about ``lr`` per element, so only weights smaller than 2^(floor(log2 lr) + 9) change at all;
for weights of typical size (normal, std ``TYPICAL_WEIGHT_STD``) and lr 1e-6 that is about 2 %.
The rest of every update is lost to rounding and training stalls without an error.
"""

from __future__ import annotations

import math

from fp8rl.protocol import JobSpec

TYPICAL_WEIGHT_STD = 0.02
"""Standard deviation of a pretrained LLM's linear weights (the usual init scale, ~1/sqrt(d))."""
BF16_MANTISSA_BITS = 8
"""Significant bits of bfloat16 (7 stored + the implicit one)."""
MIN_UPDATED_FRACTION = 0.5
"""Warn when an AdamW step at the peak lr changes fewer weights than this fraction."""


def bf16_updated_fraction(lr: float, *, weight_std: float = TYPICAL_WEIGHT_STD) -> float:
    """Fraction of N(0, weight_std²) weights stored in BF16 that an update of size ``lr`` changes
    (round to nearest: the update must reach half the spacing of the weight's binade)."""
    if lr <= 0:
        return 0.0
    largest = 2.0 ** (math.floor(math.log2(lr)) + BF16_MANTISSA_BITS + 1)
    return math.erf(largest / (weight_std * math.sqrt(2)))


def spec_warnings(job: JobSpec) -> list[str]:
    """``field: why`` lines for settings that run but may not learn."""
    out = []
    lr = job.trainer.lr
    if job.trainer.master_dtype == "bfloat16":
        fraction = bf16_updated_fraction(lr)
        if fraction < MIN_UPDATED_FRACTION:
            out.append(
                f"trainer.master_dtype: bfloat16 with trainer.lr={lr:g}: an AdamW step changes "
                f"only about {fraction:.0%} of BF16 weights of typical size (|w| ~ "
                f"{TYPICAL_WEIGHT_STD}); the rest of each update is lost to rounding, so training "
                "silently stalls. Use master_dtype: float32 (FSDP shards it; trainer.offload "
                "moves it to the host if memory is short)"
            )
    updates = optimizer_updates(job)
    if job.trainer.warmup_steps >= updates:
        peak = updates / (job.trainer.warmup_steps + 1)
        out.append(
            f"trainer.warmup_steps: {job.trainer.warmup_steps} optimizer steps of warmup, but the "
            f"run makes only {updates} ({job.steps} RL steps); the learning rate never reaches "
            f"trainer.lr (at most {peak:.0%} of it)"
        )
    return out


def optimizer_updates(job: JobSpec) -> int:
    """Optimizer steps of the whole run: per RL step, ``epochs_per_step`` passes over the batch
    in mini-batches (what the trainer's LR schedule counts, ``workers.trainer.worker``)."""
    mini = job.trainer.mini_batch_size or job.batch_size
    return job.steps * job.trainer.epochs_per_step * -(-job.batch_size // mini)
