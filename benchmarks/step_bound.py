"""What the H200 allows a decode step and a train step: per part, the larger of bytes and FLOPs.

    python benchmarks/step_bound.py --preset llama-3.1-8b --batch 64 256 --gen 512 4096 \
        --layers 8 --tokens 16384 32768

Arithmetic only (runs anywhere, no GPU). Each part of a step costs at least the larger of its
bytes over HBM and its FLOPs over the GEMM peak; a mode's floor is the sum of its parts and the
"ideal vs BF16" ratio is the speedup if both modes ran at the same fraction of their floors.
The peaks are this repository's H200 measurements (brief): BF16 GEMM ~790 TFLOP/s, blockwise
``F.scaled_mm`` ~1,340 at 8192³, HBM copy ~4.3 TB/s.

Decode (``rollout.py``'s shapes: 32 layers unless ``--layers``, prompt + gen / 2 cached tokens
per row): the linears (FP8 weights 1 byte/param + block scales, BF16 2), the KV cache (BF16 or
FP8), the BF16 lm_head. ``rollout.py``'s roofline counts bytes alone; at batch 256 the linears
are compute-bound in both modes (FP8 weights: 2·M = 512 FLOP per byte against the H200's
1,340 / 4.3 ≈ 312).

Train (``train_step.py``'s step: fwd + bwd over ``--tokens`` in sequences of ``--seq``, lm_head +
log-softmax, fused AdamW on FP32 master weights): the linears' FProp, DGrad and WGrad
(6·tokens·params FLOPs, FP8 or BF16 peak), the BF16 lm_head (6·tokens·vocab·hidden), causal
attention at the BF16 peak (forward 2·tokens·seq·heads·head_dim per layer, backward 2.5× it),
and AdamW (28 bytes per FP32 parameter: p, g, m, v read, p, m, v written). Norms, activation
quantization, RoPE, SwiGLU and residuals are left out: the floor is low, not tight.

``--measured`` prints measured rates as a % of their floor: ``decode:MODE:KV:BATCH:GEN=TOK_S``
or ``train:MODE:TOKENS=SECONDS``.
"""

from __future__ import annotations

import argparse
import dataclasses

from rollout import HBM_BYTES_PER_S, kv_bytes_per_token, linear_bytes, linear_params

from fp8rl.workers.model.config import PRESETS, DecoderConfig

BF16_FLOP_PER_S = 790e12
FP8_FLOP_PER_S = 1340e12
DECODE_MODES = (("bf16", "bf16"), ("unified_fp8", "bf16"), ("unified_fp8", "fp8"))
ADAMW_BYTES_PER_PARAM = 28


def _gemm_s(flops: float, nbytes: float, fp8: bool) -> float:
    return max(nbytes / HBM_BYTES_PER_S, flops / (FP8_FLOP_PER_S if fp8 else BF16_FLOP_PER_S))


def decode_floor_s(cfg: DecoderConfig, mode: str, kv: str, batch: int, ctx: float) -> dict:
    """Seconds one decode step needs at least, per part (``linears``, ``attention``, ``lm_head``).

    ``mode``: ``bf16`` or ``unified_fp8``; ``kv``: ``bf16`` or ``fp8`` cache; ``ctx``: mean
    cached tokens per row.
    """
    head = cfg.vocab_size * cfg.hidden_size
    return {
        "linears": _gemm_s(2 * batch * linear_params(cfg), linear_bytes(cfg, mode), mode != "bf16"),
        "attention": batch * ctx * kv_bytes_per_token(cfg, kv == "fp8") / HBM_BYTES_PER_S,
        "lm_head": _gemm_s(2 * batch * head, 2 * head, fp8=False),
    }


def train_floor_s(cfg: DecoderConfig, mode: str, tokens: int, seq: int) -> dict:
    """Seconds one train step needs at least, per part (``linears``, ``lm_head``, ``attention``,
    ``adamw``); ``tokens`` in sequences of ``seq`` (causal). Elementwise work is left out."""
    head = cfg.vocab_size * cfg.hidden_size
    embeddings = head * (1 if cfg.tie_word_embeddings else 2)
    width = cfg.num_attention_heads * cfg.head_dim
    attention_flops = 3.5 * 2 * tokens * seq * width * cfg.num_hidden_layers
    params = linear_params(cfg) + embeddings
    return {
        "linears": _gemm_s(6 * tokens * linear_params(cfg), 0.0, mode != "bf16"),
        "lm_head": _gemm_s(6 * tokens * head, 0.0, fp8=False),
        "attention": attention_flops / BF16_FLOP_PER_S,
        "adamw": params * ADAMW_BYTES_PER_PARAM / HBM_BYTES_PER_S,
    }


def _measured(items: list[str]) -> dict:
    """``decode:MODE:KV:BATCH:GEN=TOK_S`` / ``train:MODE:TOKENS=SECONDS`` → {key tuple: value}."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        kind, *fields = key.split(":")
        names = {"decode": 2, "train": 1}.get(kind)
        if not sep or names is None or len(fields) != names + (2 if kind == "decode" else 1):
            raise SystemExit(
                f"--measured {item!r}: expected decode:MODE:KV:BATCH:GEN=TOK_S or "
                "train:MODE:TOKENS=SECONDS"
            )
        try:
            sizes = tuple(int(f) for f in fields[names:])
            out[(kind, *fields[:names], *sizes)] = float(value)
        except ValueError:
            raise SystemExit(
                f"--measured {item!r}: sizes must be integers, the value a number"
            ) from None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-3.1-8b", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, nargs="*", default=[64, 256])
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--gen", type=int, nargs="*", default=[512, 4096])
    parser.add_argument("--layers", type=int, default=8, help="train step layers (train_step.py)")
    parser.add_argument("--tokens", type=int, nargs="*", default=[16384, 32768])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--measured", nargs="*", default=[], metavar="KIND:…=VALUE")
    args = parser.parse_args()
    cfg = PRESETS[args.preset]
    measured = _measured(args.measured)
    print(
        f"# Step floors, {args.preset}; HBM {HBM_BYTES_PER_S / 1e12:.1f} TB/s, GEMM "
        f"{BF16_FLOP_PER_S / 1e12:.0f} (BF16) / {FP8_FLOP_PER_S / 1e12:,.0f} (FP8) TFLOP/s\n\n"
        f"Decode, {cfg.num_hidden_layers} layers, prompt {args.prompt}\n\n"
        "| gen | batch | mode | KV | linears ms | attention ms | lm_head ms | ideal tok/s "
        "| ideal vs BF16 | measured tok/s (% of ideal) |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for gen in args.gen:
        for batch in args.batch:
            base = None
            for mode, kv in DECODE_MODES:
                parts = decode_floor_s(cfg, mode, kv, batch, args.prompt + gen / 2)
                floor = sum(parts.values())
                base = base or floor
                ms = [f"{1e3 * parts[p]:.2f}" for p in ("linears", "attention", "lm_head")]
                rate = measured.get(("decode", mode, kv, batch, gen))
                pct = f"{rate:,.0f} ({100 * rate * floor / batch:.0f} %)" if rate else ""
                print(
                    f"| {gen} | {batch} | {mode} | {kv} | {' | '.join(ms)} | "
                    f"{batch / floor:,.0f} | {base / floor:.2f}× | {pct} |"
                )
    train_cfg = dataclasses.replace(cfg, num_hidden_layers=args.layers)
    print(
        f"\nTrain step, {args.layers} layers, sequences of {args.seq}\n\n"
        "| tokens | mode | linears ms | lm_head ms | attention ms | AdamW ms | ideal s "
        "| ideal vs BF16 | measured s (% of ideal) |\n|---|---|---|---|---|---|---|---|---|"
    )
    for tokens in args.tokens:
        base = None
        for mode in ("bf16", "unified_fp8"):
            parts = train_floor_s(train_cfg, mode, tokens, args.seq)
            floor = sum(parts.values())
            base = base or floor
            ms = [f"{1e3 * v:.1f}" for v in parts.values()]
            took = measured.get(("train", mode, tokens))
            pct = f"{took:.3f} ({100 * floor / took:.0f} %)" if took else ""
            print(
                f"| {tokens} | {mode} | {' | '.join(ms)} | {floor:.3f} | {base / floor:.2f}× "
                f"| {pct} |"
            )


if __name__ == "__main__":
    main()
