"""What the H200 allows a decode step and a train step: per part, the larger of bytes and FLOPs.

    python benchmarks/step_bound.py --preset llama-3.1-8b --batch 64 256 --gen 512 4096 \
        --layers 8 --tokens 16384 32768

Arithmetic only (runs anywhere, no GPU). Each part of a step is charged the larger of its bytes
over HBM and its FLOPs over a GEMM peak; a mode's floor is the sum of its parts, and "ideal vs
BF16" is the FP8/BF16 speedup if both modes ran at the same fraction of their floors. The floors
hold only at the peaks assumed: HBM 4.3 TB/s (``rollout.py``; 4.22-4.25 measured), BF16 GEMM 790
TFLOP/s (787 at 8192³, ``results/issue14/remeasure-1820/kernels-h200.md``), blockwise FP8
``F.scaled_mm`` 1,340 (the project brief's 8192³ figure; at the model's own shapes the committed
runs measured 1,060-1,159, same file). A lower FP8 peak lowers every ratio: ``--fp8-tflops``.

Decode (``rollout.py``'s step, the preset's layers, prompt + gen / 2 cached tokens per row): the
linears (FP8 weights 1 byte/param + an FP32 scale per 128×128 block, BF16 2), the KV cache (BF16
or FP8), the BF16 lm_head. ``rollout.py``'s roofline counts bytes alone; at batch 256 the linears
are compute-bound in both modes (FP8 weights: 2·M = 512 FLOP per byte against 1,340 / 4.3 ≈ 312).

Train (``train_step.py``'s step, ``--layers`` layers: fwd + bwd over ``--tokens`` in sequences of
``--seq``, the chunked lm_head + log-softmax, fused AdamW on FP32 master weights): the linears'
FProp, DGrad and WGrad (6·tokens·params FLOPs at the mode's peak), the BF16 lm_head run four
times (forward, the checkpointed recompute in the backward of ``workers/model/logprob.py``,
DGrad, WGrad: 8·tokens·vocab·hidden), causal attention at the BF16 peak (forward
2·tokens·seq·heads·head_dim per layer, backward 2.5× it), and AdamW (28 bytes per FP32
parameter of the linears and both embeddings: p, g, m, v read, p, m, v written). The
log-softmax, norms, activation and gradient quantization, RoPE, SwiGLU, residuals and weight
casts are left out: the train floor is low, not tight, and what it leaves out costs FP8 more.

``--measured`` prints measured rates as a % of their floor: ``decode:MODE:KV:BATCH:GEN=TOK_S``
or ``train:MODE:TOKENS=SECONDS`` (MODE ``bf16`` or ``unified_fp8``; decode KV ``bf16`` or
``fp8``, FP8 only with ``unified_fp8``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math

from rollout import HBM_BYTES_PER_S, kv_bytes_per_token, linear_bytes, linear_params

from fp8rl.workers.model.config import PRESETS, DecoderConfig

BF16_FLOP_PER_S = 790e12
FP8_FLOP_PER_S = 1340e12
DECODE_MODES = (("bf16", "bf16"), ("unified_fp8", "bf16"), ("unified_fp8", "fp8"))
TRAIN_MODES = ("bf16", "unified_fp8")
ADAMW_BYTES_PER_PARAM = 28
LM_HEAD_TRAIN_GEMMS = 4  # forward, checkpointed recompute, DGrad, WGrad


def decode_floor_s(
    cfg: DecoderConfig, mode: str, kv: str, batch: int, ctx: float, fp8_flop_per_s: float
) -> dict[str, float]:
    """Seconds one decode step needs at least, per part (``linears``, ``attention``, ``lm_head``).

    ``mode``: ``bf16`` or ``unified_fp8``; ``kv``: ``bf16`` or ``fp8`` cache; ``ctx``: mean
    cached tokens per row; ``fp8_flop_per_s``: the FP8 GEMM peak.
    """
    head = cfg.vocab_size * cfg.hidden_size
    peak = fp8_flop_per_s if mode != "bf16" else BF16_FLOP_PER_S
    return {
        "linears": max(
            linear_bytes(cfg, mode) / HBM_BYTES_PER_S, 2 * batch * linear_params(cfg) / peak
        ),
        "attention": batch * ctx * kv_bytes_per_token(cfg, kv == "fp8") / HBM_BYTES_PER_S,
        "lm_head": max(2 * head / HBM_BYTES_PER_S, 2 * batch * head / BF16_FLOP_PER_S),
    }


def train_floor_s(
    cfg: DecoderConfig, mode: str, tokens: int, seq: int, fp8_flop_per_s: float
) -> dict[str, float]:
    """Seconds one train step needs at least, per part (``linears``, ``lm_head``, ``attention``,
    ``adamw``); ``tokens`` in causal sequences of ``seq``. The GEMMs at these sizes are
    compute-bound, so they are charged FLOPs only; elementwise work is left out."""
    head = cfg.vocab_size * cfg.hidden_size
    embeddings = head * (1 if cfg.tie_word_embeddings else 2)
    width = cfg.num_attention_heads * cfg.head_dim
    peak = fp8_flop_per_s if mode != "bf16" else BF16_FLOP_PER_S
    return {
        "linears": 6 * tokens * linear_params(cfg) / peak,
        "lm_head": 2 * LM_HEAD_TRAIN_GEMMS * tokens * head / BF16_FLOP_PER_S,
        "attention": 3.5 * 2 * tokens * seq * width * cfg.num_hidden_layers / BF16_FLOP_PER_S,
        "adamw": (linear_params(cfg) + embeddings) * ADAMW_BYTES_PER_PARAM / HBM_BYTES_PER_S,
    }


def parse_measured(items: list[str]) -> dict[tuple, float]:
    """``decode:MODE:KV:BATCH:GEN=TOK_S`` / ``train:MODE:TOKENS=SECONDS`` → {key: value}.

    Raises SystemExit naming the item: a malformed one, a mode (or mode and KV) that no row
    prints, a size that is not a positive integer, a value that is not finite and > 0, or the
    same key twice."""
    out: dict[tuple, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        kind, *fields = key.split(":")
        try:
            if kind == "decode" and sep and len(fields) == 4:
                names, sizes = tuple(fields[:2]), tuple(int(f) for f in fields[2:])
                known = names in DECODE_MODES
            elif kind == "train" and sep and len(fields) == 2:
                names, sizes = (fields[0],), (int(fields[1]),)
                known = fields[0] in TRAIN_MODES
            else:
                raise SystemExit(
                    f"--measured {item!r}: expected decode:MODE:KV:BATCH:GEN=TOK_S or "
                    "train:MODE:TOKENS=SECONDS"
                )
            rate = float(value)
        except ValueError:
            raise SystemExit(
                f"--measured {item!r}: sizes must be integers, the value a number"
            ) from None
        if not known:
            raise SystemExit(
                f"--measured {item!r}: no such row; modes {TRAIN_MODES}, decode (mode, KV) in "
                f"{DECODE_MODES}"
            )
        if min(sizes) <= 0 or not math.isfinite(rate) or rate <= 0:
            raise SystemExit(f"--measured {item!r}: sizes and the value must be > 0 and finite")
        full = (kind, *names, *sizes)
        if full in out:
            raise SystemExit(f"--measured {item!r}: given twice")
        out[full] = rate
    return out


def positive(text: str) -> int:
    """argparse type: an integer > 0."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not > 0")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-3.1-8b", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=positive, nargs="+", default=[64, 256])
    parser.add_argument("--prompt", type=positive, default=128)
    parser.add_argument("--gen", type=positive, nargs="+", default=[512, 4096])
    parser.add_argument("--layers", type=positive, default=8, help="train step layers only")
    parser.add_argument("--tokens", type=positive, nargs="+", default=[16384, 32768])
    parser.add_argument("--seq", type=positive, default=4096)
    parser.add_argument("--fp8-tflops", type=float, default=FP8_FLOP_PER_S / 1e12)
    parser.add_argument("--measured", nargs="*", default=[], metavar="KIND:…=VALUE")
    args = parser.parse_args()
    if any(t % args.seq for t in args.tokens):
        parser.error(f"--tokens must be multiples of --seq ({args.seq}), as in train_step.py")
    if not math.isfinite(args.fp8_tflops) or args.fp8_tflops <= 0:
        parser.error("--fp8-tflops must be > 0")
    fp8_peak = args.fp8_tflops * 1e12
    cfg = PRESETS[args.preset]
    measured = parse_measured(args.measured)
    used = set()
    print(
        f"# Step floors, {args.preset}; HBM {HBM_BYTES_PER_S / 1e12:.1f} TB/s, GEMM "
        f"{BF16_FLOP_PER_S / 1e12:.0f} (BF16) / {fp8_peak / 1e12:,.0f} (FP8) TFLOP/s\n\n"
        f"Decode, {cfg.num_hidden_layers} layers, prompt {args.prompt}\n\n"
        "| gen | batch | mode | KV | linears ms | attention ms | lm_head ms | ideal tok/s "
        "| ideal vs BF16 | measured tok/s (% of ideal) |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for gen in args.gen:
        for batch in args.batch:
            base = None
            for mode, kv in DECODE_MODES:
                parts = decode_floor_s(cfg, mode, kv, batch, args.prompt + gen / 2, fp8_peak)
                floor = sum(parts.values())
                base = base or floor
                ms = [f"{1e3 * parts[p]:.2f}" for p in ("linears", "attention", "lm_head")]
                key = ("decode", mode, kv, batch, gen)
                rate = measured.get(key)
                used.add(key)
                seen = "" if rate is None else f"{rate:,.0f} ({100 * rate * floor / batch:.0f} %)"
                print(
                    f"| {gen} | {batch} | {mode} | {kv} | {' | '.join(ms)} | "
                    f"{batch / floor:,.0f} | {base / floor:.2f}× | {seen} |"
                )
    train_cfg = dataclasses.replace(cfg, num_hidden_layers=args.layers)
    print(
        f"\nTrain step, {args.layers} layers, sequences of {args.seq}\n\n"
        "| tokens | mode | linears ms | lm_head ms | attention ms | AdamW ms | ideal s "
        "| ideal vs BF16 | measured s (% of ideal) |\n|---|---|---|---|---|---|---|---|---|"
    )
    for tokens in args.tokens:
        base = None
        for mode in TRAIN_MODES:
            parts = train_floor_s(train_cfg, mode, tokens, args.seq, fp8_peak)
            floor = sum(parts.values())
            base = base or floor
            ms = [f"{1e3 * parts[p]:.1f}" for p in ("linears", "lm_head", "attention", "adamw")]
            key = ("train", mode, tokens)
            took = measured.get(key)
            used.add(key)
            seen = "" if took is None else f"{took:.3f} ({100 * floor / took:.0f} %)"
            print(
                f"| {tokens} | {mode} | {' | '.join(ms)} | {floor:.3f} | {base / floor:.2f}× "
                f"| {seen} |"
            )
    for key in measured.keys() - used:
        print(f"warning: --measured {':'.join(map(str, key))} matches no printed row")


if __name__ == "__main__":
    main()
