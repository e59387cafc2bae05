"""What the H200 allows a decode step: the larger of its bytes and its FLOPs, per part.

    python benchmarks/decode_bound.py --preset llama-3.1-8b --batch 64 256 --gen 512 4096

Arithmetic only (runs anywhere, no GPU). ``rollout.py``'s roofline counts bytes alone; at batch
256 the linears are compute-bound (FP8 weights: 2·M FLOP per byte = 512 at M = 256, above the
H200's 1,340 / 4.3 ≈ 312), so this prints, per part of one step:

- linears: max(weight bytes / HBM, 2·M·params / GEMM peak), BF16 or FP8 peak by mode;
- attention: KV-cache bytes at the run's mean context (prompt + gen / 2) / HBM;
- lm_head (BF16 in both modes): max(bytes / HBM, FLOPs / BF16 peak);

then the ideal tok/s (batch / step) and its FP8/BF16 ratio: the speedup if both modes ran at the
same fraction of their floors. The peaks are this repository's H200 measurements (brief): BF16
GEMM ~790 TFLOP/s, blockwise ``F.scaled_mm`` ~1,340 at 8192³, HBM copy ~4.3 TB/s. Pass
``--measured MODE:KV:BATCH:GEN=TOK_S`` to print a measured rate as a % of its floor.
"""

from __future__ import annotations

import argparse

from rollout import HBM_BYTES_PER_S, kv_bytes_per_token, linear_bytes, linear_params

from fp8rl.workers.model.config import PRESETS, DecoderConfig

BF16_FLOP_PER_S = 790e12
FP8_FLOP_PER_S = 1340e12
MODES = (("bf16", "bf16"), ("unified_fp8", "bf16"), ("unified_fp8", "fp8"))


def step_floor_s(cfg: DecoderConfig, mode: str, kv: str, batch: int, ctx: float) -> dict:
    """Seconds one decode step needs at least, per part (``linears``, ``attention``, ``lm_head``).

    ``mode``: ``bf16`` or ``unified_fp8`` (FP8 linears, 1 byte/param + 128×128 FP32 block
    scales); ``kv``: ``bf16`` or ``fp8`` cache; ``ctx``: mean cached tokens per row.
    """
    fp8 = mode != "bf16"
    head_params = cfg.vocab_size * cfg.hidden_size
    return {
        "linears": max(
            linear_bytes(cfg, mode) / HBM_BYTES_PER_S,
            2 * batch * linear_params(cfg) / (FP8_FLOP_PER_S if fp8 else BF16_FLOP_PER_S),
        ),
        "attention": batch * ctx * kv_bytes_per_token(cfg, kv == "fp8") / HBM_BYTES_PER_S,
        "lm_head": max(
            head_params * 2 / HBM_BYTES_PER_S, 2 * batch * head_params / BF16_FLOP_PER_S
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-3.1-8b", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--gen", type=int, nargs="+", default=[512, 4096])
    parser.add_argument(
        "--measured",
        nargs="*",
        default=[],
        metavar="MODE:KV:BATCH:GEN=TOK_S",
        help="measured decode rates to print as a %% of their floor",
    )
    args = parser.parse_args()
    cfg = PRESETS[args.preset]
    measured = {}
    for item in args.measured:
        key, _, rate = item.partition("=")
        mode, kv, batch, gen = key.split(":")
        measured[(mode, kv, int(batch), int(gen))] = float(rate)
    print(
        f"# Decode-step floor, {args.preset}, prompt {args.prompt}; HBM "
        f"{HBM_BYTES_PER_S / 1e12:.1f} TB/s, GEMM {BF16_FLOP_PER_S / 1e12:.0f} (BF16) / "
        f"{FP8_FLOP_PER_S / 1e12:,.0f} (FP8) TFLOP/s\n\n"
        "| gen | batch | mode | KV | linears ms | attention ms | lm_head ms | ideal tok/s "
        "| ideal vs BF16 | measured tok/s (% of ideal) |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for gen in args.gen:
        ctx = args.prompt + gen / 2
        for batch in args.batch:
            base = None
            for mode, kv in MODES:
                parts = step_floor_s(cfg, mode, kv, batch, ctx)
                ideal = batch / sum(parts.values())
                base = base or ideal
                rate = measured.get((mode, kv, batch, gen))
                seen = f"{rate:,.0f} ({100 * rate / ideal:.0f} %)" if rate else ""
                print(
                    f"| {gen} | {batch} | {mode} | {kv} | {1e3 * parts['linears']:.2f} | "
                    f"{1e3 * parts['attention']:.2f} | {1e3 * parts['lm_head']:.2f} | "
                    f"{ideal:,.0f} | {ideal / base:.2f}× | {seen} |"
                )


if __name__ == "__main__":
    main()
