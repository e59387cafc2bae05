"""Fast-mode mismatch (unified FP8, exact off) by engine configuration, in one process (H200).

    python benchmarks/mismatch_attribution.py [--out DIR] [--seeds 0 1]

``fp8rl mismatch``'s measurement (``services.mismatch.measure_mode``: the native engine samples,
the trainer forward scores the same ids) under these configurations, switched by patching the
dispatch functions in this process only:

* ``committed``: the code as committed: fused norm/SwiGLU-quant kernels in the engine, the
  trainer's fast RMSNorm / SiLU·mul running the same Triton arithmetic, the split-K decode GEMM
  off (``gemm_decode_triton.set_enabled``); the decode GEMM runs only the table's parity-safe
  rows (8B/7B shapes only), every other FP8 GEMM is cuBLASLt ``scaled_mm`` as in the trainer
  (or the tiled Triton kernel below M = 16).
* ``parity-safe rows off``: as committed without those rows (``set_parity_safe(False)``).
* ``decode GEMM on``: as committed, with the decode GEMM dispatched per the tuned table.
* ``decode GEMM on, trainer torch ops``: also the trainer's RMSNorm / SiLU·mul on the torch
  float32 ops: the state before this fix (up to the fused kernels' float64 mean square).
* ``attention on SDPA``: as committed with the fast mode's attention on SDPA
  (``invariant.set_fast_attention("sdpa")``), the engine and trainer of before 2026-12-04.
* ``decode tiles``: as committed with the engine's decode attention over a BF16 cache on 16-row
  tiles (``set_fast_attention("triton_decode16")``).
* ``pre-issue-14 engine``: no fused blocks, no decode GEMM, torch norm/SiLU: the engine of
  2026-11-29 (token_mult_prob_error 1.00252703 tiny-llama, 1.02448287 small-llama then).

Also checks whether a GEMM row depends on M (cuBLASLt vs itself, decode kernel vs cuBLASLt).
Prints one table per model; writes ``mismatch-attribution.{md,json}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import time
from pathlib import Path

import torch

from fp8rl.kernels import fused, gemm_decode_triton, invariant
from fp8rl.workers.model import decoder


@contextlib.contextmanager
def _patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _torch_silu_mul(gate, up):
    return torch.nn.functional.silu(gate) * up


def _variant(name: str) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    if name in ("decode GEMM on, trainer torch ops", "pre-issue-14 engine"):
        stack.enter_context(_patched(invariant, "rms_norm_fast", fused.rms_norm_reference))
        stack.enter_context(_patched(invariant, "silu_mul_fast", _torch_silu_mul))
    if name == "parity-safe rows off":
        previous = gemm_decode_triton.set_parity_safe(False)
        stack.callback(gemm_decode_triton.set_parity_safe, previous)
    if name.startswith("decode GEMM on"):
        previous = gemm_decode_triton.set_enabled(True)
        stack.callback(gemm_decode_triton.set_enabled, previous)
    if name in ("attention on SDPA", "pre-issue-14 engine"):
        previous_attention = invariant.set_fast_attention("sdpa")
        stack.callback(invariant.set_fast_attention, previous_attention)
    if name == "decode tiles":
        previous_attention = invariant.set_fast_attention("triton_decode16")
        stack.callback(invariant.set_fast_attention, previous_attention)
    if name == "pre-issue-14 engine":
        stack.enter_context(_patched(decoder.Block, "fused_ready", lambda self: False))
    return stack


VARIANTS = [
    "committed",
    "parity-safe rows off",
    "decode GEMM on",
    "decode GEMM on, trainer torch ops",
    "attention on SDPA",
    "decode tiles",
    "pre-issue-14 engine",
]


def _measure(preset: str, max_tokens: int, seed: int, layers: int | None) -> dict[str, float]:
    from fp8rl.protocol import ModelSpec, PrecisionSpec, SamplingParams
    from fp8rl.services.mismatch import measure_mode
    from fp8rl.workers.model.config import PRESETS
    from fp8rl.workers.model.loading import ModelSource

    cfg = PRESETS[preset]
    if layers:
        cfg = dataclasses.replace(cfg, num_hidden_layers=layers)
    source = ModelSource(cfg, None, None, f"random:{preset}")
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, cfg.vocab_size, (int(torch.randint(8, 48, (1,), generator=gen)),),
                      generator=gen).tolist()
        for _ in range(16)
    ]  # fmt: skip
    report = measure_mode(
        source,
        ModelSpec(path=f"random:{preset}", max_model_len=512),
        PrecisionSpec(mode="unified_fp8", exact=False),
        prompts,
        SamplingParams(n=2, temperature=1.0, max_tokens=max_tokens, seed=seed),
        device=torch.device("cuda"),
        batch_size=32,
    )
    return {k.split("/")[1]: v for k, v in report.metrics.items()}


def _gemm_rows() -> dict[str, float]:
    """Is a GEMM row bitwise the same at M=32 as inside M=4096 (the trainer's M)? For the decode
    kernel: the fraction of differing BF16 outputs per config (split 1 included)."""
    from fp8rl.kernels import fp8_gemm, per_block_quant, per_token_group_quant
    from fp8rl.kernels.quant import QuantizedTensor

    out: dict[str, float] = {}
    for n, k in ((3072, 1024), (6144, 4096)):
        w = per_block_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
        x = per_token_group_quant(torch.randn(4096, k, device="cuda", dtype=torch.bfloat16))
        big = fp8_gemm(x, w, out_dtype=torch.bfloat16)
        for m in (32, 64):
            small = QuantizedTensor(x.codes[:m], x.scale[:m], x.block)  # the same rows
            lib = fp8_gemm(small, w, out_dtype=torch.bfloat16)
            out[f"N={n} K={k} M={m} scaled_mm differs"] = float((lib != big[:m]).float().mean())
            for bm, bn, split, warps in ((64, 64, 1, 4), (64, 128, 1, 4), (64, 128, 1, 8),
                                         (m, 64, 1, 4), (m, 64, 4, 4)):  # fmt: skip
                cfg = gemm_decode_triton.DecodeConfig(bm, bn, split, warps)
                dec = gemm_decode_triton.fp8_gemm_decode(
                    small, w, out_dtype=torch.bfloat16, config=cfg
                )[0]
                key = f"N={n} K={k} M={m} decode {bm}x{bn} split {split} warps {warps} differs"
                out[key] = float((dec != big[:m]).float().mean())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--variants", nargs="+", default=VARIANTS)
    parser.add_argument(
        "--presets",
        nargs="+",
        default=["tiny-llama", "small-llama"],
        help="model presets (random weights); e.g. llama-3.1-8b with --layers 2 runs the 8B "
        "shapes the parity-safe decode GEMM rows cover",
    )
    parser.add_argument("--layers", type=int, help="override num_hidden_layers of every preset")
    args = parser.parse_args()
    rows, lines = [], []
    gemm = _gemm_rows()
    print(json.dumps(gemm), flush=True)
    for preset in args.presets:
        max_tokens = 128 if preset == "tiny-llama" else 256
        for name in args.variants:
            for seed in args.seeds:
                t0 = time.perf_counter()
                with _variant(name):
                    m = _measure(preset, max_tokens, seed, args.layers)
                row = {"model": preset, "variant": name, "seed": seed,
                       "s": round(time.perf_counter() - t0, 1), **m}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    lines += ["| model | variant | seed | token_mult_prob_error | max abs Δlogp |",
              "|---|---|---|---|---|"]  # fmt: skip
    lines += [
        f"| {r['model']} | {r['variant']} | {r['seed']} | {r['token_mult_prob_error']:.8f} | "
        f"{r['abs_dlogp_max']:.3g} |"
        for r in rows
    ]
    lines += ["", *(f"- {k}: {v}" for k, v in gemm.items())]
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "mismatch-attribution.md").write_text("\n".join(lines) + "\n")
        (args.out / "mismatch-attribution.json").write_text(
            json.dumps({"gemm": gemm, "rows": rows})
        )


if __name__ == "__main__":
    main()
