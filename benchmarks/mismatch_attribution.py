"""Fast-mode mismatch (unified FP8, exact off) by engine configuration, in one process (H200).

    python benchmarks/mismatch_attribution.py [--out DIR] [--seeds 0 1]

``fp8rl mismatch``'s measurement (``services.mismatch.measure_mode``: the native engine samples,
the trainer forward scores the same ids) under four configurations, switched by patching the
dispatch functions in this process only:

* ``fixed``: the code as committed: fused norm/SwiGLU-quant kernels in the engine, and the
  trainer's fast RMSNorm / SiLU·mul running the same Triton arithmetic; decode GEMM per table.
* ``trainer torch ops``: the trainer's (and unfused engine ops') RMSNorm / SiLU·mul back on the
  torch float32 ops, i.e. the state before the fix (the fused kernels themselves now sum the mean
  square in float64, so this is that state up to that change).
* ``fixed, no decode GEMM``: as ``fixed`` but every FP8 GEMM on cuBLASLt ``scaled_mm`` / the tiled
  kernel (the split-K decode kernel off).
* ``pre-issue-14 engine``: no fused blocks, no decode GEMM, torch norm/SiLU: the engine of
  2026-11-29 (token_mult_prob_error 1.00252703 tiny-llama, 1.02448287 small-llama then).

Also checks whether a GEMM row depends on M (cuBLASLt vs itself, decode kernel vs cuBLASLt).
Prints one table per model; writes ``mismatch-attribution.{md,json}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
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
    if name in ("trainer torch ops", "pre-issue-14 engine"):
        stack.enter_context(_patched(invariant, "rms_norm_fast", fused.rms_norm_reference))
        stack.enter_context(_patched(invariant, "silu_mul_fast", _torch_silu_mul))
    if name in ("fixed, no decode GEMM", "pre-issue-14 engine"):
        stack.enter_context(_patched(gemm_decode_triton, "decode_wins", lambda m, n, k: False))
        stack.enter_context(_patched(gemm_decode_triton, "prologue_wins", lambda m, n, k: False))
    if name == "pre-issue-14 engine":
        stack.enter_context(_patched(decoder.Block, "fused_ready", lambda self: False))
    return stack


VARIANTS = ["fixed", "trainer torch ops", "fixed, no decode GEMM", "pre-issue-14 engine"]


def _measure(preset: str, max_tokens: int, seed: int) -> dict[str, float]:
    from fp8rl.protocol import ModelSpec, PrecisionSpec, SamplingParams
    from fp8rl.services.mismatch import measure_mode
    from fp8rl.workers.model.config import PRESETS
    from fp8rl.workers.model.loading import ModelSource

    cfg = PRESETS[preset]
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


def _gemm_rows() -> dict[str, bool]:
    """Is a GEMM row bitwise the same at M=32 as inside M=4096 (the trainer's M)?"""
    from fp8rl.kernels import fp8_gemm, per_block_quant, per_token_group_quant

    w = per_block_quant(torch.randn(3072, 1024, device="cuda", dtype=torch.bfloat16) * 0.02)
    x = per_token_group_quant(torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16))
    small = per_token_group_quant(x.dequantize(torch.bfloat16)[:32])
    big = fp8_gemm(x, w, out_dtype=torch.bfloat16)[:32]
    with _patched(gemm_decode_triton, "decode_wins", lambda m, n, k: False):
        lib32 = fp8_gemm(small, w, out_dtype=torch.bfloat16)
    with _patched(gemm_decode_triton, "decode_wins", lambda m, n, k: True):
        dec32 = fp8_gemm(small, w, out_dtype=torch.bfloat16)
    return {
        "scaled_mm M=32 rows == M=4096 rows": bool(torch.equal(lib32, big)),
        "decode M=32 rows == scaled_mm M=4096 rows": bool(torch.equal(dec32, big)),
        "decode vs M=4096 differing elements": float((dec32 != big).float().mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--variants", nargs="+", default=VARIANTS)
    args = parser.parse_args()
    rows, lines = [], []
    gemm = _gemm_rows()
    print(json.dumps(gemm), flush=True)
    for preset, max_tokens in (("tiny-llama", 128), ("small-llama", 256)):
        for name in args.variants:
            for seed in args.seeds:
                t0 = time.perf_counter()
                with _variant(name):
                    m = _measure(preset, max_tokens, seed)
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
