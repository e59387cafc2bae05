"""Benchmark fp8rl's FP8 kernels on one GPU against BF16 (issue 3, item 6).

One run prints a short table and writes ``kernels-<gpu>.md`` (the committed table) and a JSON file
with every number to ``--out``. Measured:

* ceilings: device-to-device copy (TB/s, bytes read + written) and a BF16 8192³ matmul;
* quantizers (TB/s, bytes read + written): 1×128 at M ∈ {1 … 16384} for K = 4096 / 14336, the
  128×128 weight quantizer at the 8B shapes, 128×1 and the FP8→128×1 re-quantization;
* GEMMs (TFLOP/s, speedup over BF16 ``torch.matmul``) at M ∈ {1, 16, 128, 256, 4096, 16384} for
  the linear layers of Llama-3.1-8B and Qwen2.5-7B: the dispatcher's default backend
  (``scaled_mm``), the Triton kernel (fast and ``exact`` configs) and ``fp8_linear`` end to end
  (1×128 activation quantization included);
* FP8Linear forward+backward against BF16 ``nn.Linear`` at the Llama-3.1-8B shapes, 16K tokens.

Timing: ``triton.testing.do_bench`` medians (CUDA events, L2 flushed before every repetition),
random normal data (never zeros). Run: ``python benchmarks/kernels.py --out results/``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import warnings
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from fp8rl.kernels import (
    FP8Linear,
    deferred_finite_checks,
    fp8_gemm,
    fp8_linear,
    gemm_triton,
    kernel_backend,
    per_block_quant,
    per_token_and_column_group_quant,
    per_token_group_quant,
    quant_triton,
)
from fp8rl.kernels import gemm as gemm_module

MS = (1, 16, 128, 256, 4096, 16384)
LAYERS = {  # (N, K) of the [N, K] weights
    "llama3.1-8b": {
        "qkv": (6144, 4096),
        "o": (4096, 4096),
        "gate_up": (28672, 4096),
        "down": (4096, 14336),
    },
    "qwen2.5-7b": {
        "qkv": (4608, 3584),
        "o": (3584, 3584),
        "gate_up": (37888, 3584),
        "down": (3584, 18944),
    },
}
TOKENS = 16384


def bench(fn, *, rep: int = 60) -> float:
    """Median milliseconds of ``fn`` (warm-up excluded)."""
    return float(do_bench(fn, warmup=15, rep=rep, return_mode="median"))


def bench_graph(fns: list) -> float:
    """Median ms per call of ``fns`` replayed round-robin from one CUDA graph.

    Removes Python/launch overhead (what a CUDA-graphed decode step sees) and, since each closure
    uses its own buffers, keeps the weights out of L2 (do_bench also flushes L2 per replay).
    """
    for fn in fns:  # compile, and let library backends settle their choices outside capture
        fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    return bench(graph.replay) / len(fns)


def environment() -> dict:
    props = torch.cuda.get_device_properties(0)
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "backend": kernel_backend("cuda"),
        "backend_exact": kernel_backend("cuda", exact=True),
    }


def ceilings() -> dict:
    src = torch.randn(1024 * 1024 * 1024 // 2, device="cuda", dtype=torch.bfloat16)  # 1 GiB
    dst = torch.empty_like(src)
    copy_ms = bench(lambda: dst.copy_(src))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_ms = bench(lambda: a @ b)
    return {
        "copy_tbps": 2 * src.numel() * 2 / copy_ms / 1e9,
        "bf16_8192_tflops": 2 * 8192**3 / mm_ms / 1e9,
    }


def _row(op: str, shape: str, ms: float, nbytes: float) -> dict:
    return {"op": op, "shape": shape, "ms": ms, "tbps": nbytes / ms / 1e9}


def quantizer_rows() -> list[dict]:
    """Triton kernels timed from CUDA graphs (no launch overhead); public wrappers eager."""
    rows = []
    for k in (4096, 14336):
        for m in MS:
            copies = 8 if m <= 256 else 1  # small inputs: rotate buffers so L2 stays cold
            xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
            ms = bench_graph([lambda x=x: quant_triton.per_token_group_quant_triton(x) for x in xs])
            nbytes = m * k * 3 + 4 * m * triton.cdiv(k, 128)
            rows.append(_row("1x128 (per_token_group)", f"{m}x{k}", ms, nbytes))
    for name, (n, k) in LAYERS["llama3.1-8b"].items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        ms = bench_graph([lambda w=w: quant_triton.per_block_quant_triton(w)])
        rows.append(
            _row(f"128x128 weight ({name})", f"{n}x{k}", ms, n * k * 3 + 4 * (n * k) // 16384)
        )
    for k in (4096, 14336):
        x = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16)
        shape, elems = f"{TOKENS}x{k}", TOKENS * k
        ms = bench_graph([lambda x=x: quant_triton.per_column_group_quant_triton(x)])
        rows.append(_row("128x1 (per_column_group)", shape, ms, elems * 3 + elems // 32))
        saved = quant_triton.per_token_group_quant_triton(x)
        ms = bench_graph([lambda s=saved: quant_triton.requant_to_column_groups_triton(s)])
        rows.append(_row("FP8 1x128 -> 128x1 requant", shape, ms, elems * 2 + elems // 16))
        ms = bench(lambda x=x: per_token_group_quant(x))
        rows.append(
            _row("1x128 public, eager (+ isfinite sync)", shape, ms, elems * 3 + elems // 32)
        )
        ms = bench(lambda x=x: per_token_and_column_group_quant(x))
        rows.append(
            _row("1x128 + 128x1 public, eager (1 sync)", shape, ms, elems * 5 + elems // 16)
        )
    return rows


def quantizer_sweep() -> list[dict]:
    """Tile variants of the 1x128 and 128x1 kernels at 16K tokens (the defaults are one of them)."""
    rows = []
    for k in (4096, 14336):
        x = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16)
        elems = TOKENS * k
        for block_r, gpp, warps in (
            (8, 4, 4),
            (16, 4, 4),
            (32, 4, 8),
            (16, 8, 8),
            (32, 2, 4),
            (64, 1, 4),
            (32, 1, 4),
        ):
            fn = partial(
                quant_triton.per_token_group_quant_triton,
                x,
                block_r=block_r,
                groups_per_program=gpp,
                num_warps=warps,
            )
            ms = bench_graph([fn])
            rows.append(
                _row(
                    f"1x128 rows={block_r} groups={gpp} warps={warps}",
                    f"{TOKENS}x{k}",
                    ms,
                    elems * 3 + elems // 32,
                )
            )
        saved = quant_triton.per_token_group_quant_triton(x)
        for block_c, warps in ((32, 4), (64, 4), (64, 8), (128, 4), (128, 8), (32, 2)):
            for op, fn, nbytes in (
                ("128x1", quant_triton.per_column_group_quant_triton, elems * 3 + elems // 32),
                ("requant", quant_triton.requant_to_column_groups_triton, elems * 2 + elems // 16),
            ):
                arg = x if op == "128x1" else saved
                ms = bench_graph([partial(fn, arg, block_c=block_c, num_warps=warps)])
                rows.append(_row(f"{op} cols={block_c} warps={warps}", f"{TOKENS}x{k}", ms, nbytes))
    return rows


KEYS = ("default", "triton", "triton_exact", "fp8_linear", "fp8_linear_deferred",
        "fp8_linear_unchecked")  # fmt: skip


def _gemm_variants(x, w, wq, xq) -> dict:
    return {
        "bf16": lambda: torch.matmul(x, w.t()),
        "default": lambda: fp8_gemm(xq, wq, out_dtype=torch.bfloat16),
        "triton": lambda: gemm_triton.fp8_gemm_triton(xq, wq, out_dtype=torch.bfloat16),
        "triton_exact": lambda: gemm_triton.fp8_gemm_triton(
            xq, wq, out_dtype=torch.bfloat16, exact=True
        ),
        "fp8_linear": lambda: fp8_linear(x, wq),
        "fp8_linear_deferred": lambda: fp8_linear(x, wq),  # timed inside deferred_finite_checks
        "fp8_linear_unchecked": lambda: fp8_linear(x, wq, check_finite=False),
    }


def gemm_rows() -> list[dict]:
    rows = []
    for model, layers in LAYERS.items():
        for name, (n, k) in layers.items():
            copies = min(
                8, max(1, triton.cdiv(3 * 60 * 2**20, n * k * 2))
            )  # > 3x L2 of bf16 weights
            weights = [
                torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)
            ]
            quantized = [per_block_quant(w) for w in weights]
            for m in MS:
                refused_before = len(gemm_module._REFUSED)
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                xq = quant_triton.per_token_group_quant_triton(x)
                variants = [
                    _gemm_variants(x, w, wq, xq) for w, wq in zip(weights, quantized, strict=True)
                ]
                times = {}
                for key in variants[0]:
                    deferred = key == "fp8_linear_deferred"
                    with deferred_finite_checks() if deferred else nullcontext():
                        if m <= 256:
                            times[key] = bench_graph([v[key] for v in variants])
                        else:
                            times[key] = bench(variants[0][key])
                flops = 2 * m * n * k
                row = {"model": model, "layer": name, "m": m, "n": n, "k": k, "graph": m <= 256,
                       "default_refused": len(gemm_module._REFUSED) > refused_before}  # fmt: skip
                for key, ms in times.items():
                    row[f"{key}_ms"] = ms
                    row[f"{key}_tflops"] = flops / ms / 1e9
                    row[f"{key}_speedup"] = times["bf16"] / ms
                rows.append(row)
                print(f"  {model:12s} {name:8s} M={m:6d} bf16 {row['bf16_tflops']:7.1f}  default "
                      f"{row['default_tflops']:7.1f}  triton {row['triton_tflops']:7.1f}  exact "
                      f"{row['triton_exact_tflops']:7.1f} TFLOP/s", flush=True)  # fmt: skip
            del weights, quantized
    return rows


def _linear_times(n: int, k: int) -> dict[str, float]:
    x = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(TOKENS, n, device="cuda", dtype=torch.bfloat16)
    dense = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    fp8 = FP8Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    unchecked = FP8Linear(k, n, bias=False, check_finite=False, device="cuda", dtype=torch.bfloat16)
    exact = FP8Linear(k, n, bias=False, exact=True, device="cuda", dtype=torch.bfloat16)

    def step(layer, requantize=False):
        if requantize:
            layer.invalidate_quantized()
        layer(x).backward(grad)
        layer.weight.grad, x.grad = None, None

    return {
        "bf16": bench(lambda: step(dense)),
        "fp8": bench(lambda: step(fp8)),
        "fp8_requant": bench(lambda: step(fp8, True)),
        "fp8_nocheck": bench(lambda: step(unchecked)),
        "fp8_exact": bench(lambda: step(exact)),
    }


def _breakdown(n: int, k: int) -> dict[str, float]:
    """Milliseconds of the pieces of one FP8Linear forward+backward (16K tokens, eager)."""
    x = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(TOKENS, n, device="cuda", dtype=torch.bfloat16)
    wq = per_block_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
    xq = quant_triton.per_token_group_quant_triton(x)
    g_rows = quant_triton.per_token_group_quant_triton(grad)
    g_cols = quant_triton.per_column_group_quant_triton(grad)
    x_cols = quant_triton.requant_to_column_groups_triton(xq)
    bf16 = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16).weight
    return {
        "fprop_gemm": bench(lambda: fp8_gemm(xq, wq, out_dtype=torch.bfloat16)),
        "dgrad_gemm": bench(lambda: fp8_gemm(g_rows, wq.t(), out_dtype=torch.bfloat16)),
        "wgrad_gemm": bench(lambda: fp8_gemm(g_cols.t(), x_cols.t(), out_dtype=torch.bfloat16)),
        "quantizers": bench(lambda: quant_triton.per_token_group_quant_triton(x))
        + bench(lambda: quant_triton.per_token_group_quant_triton(grad))
        + bench(lambda: quant_triton.per_column_group_quant_triton(grad))
        + bench(lambda: quant_triton.requant_to_column_groups_triton(xq)),
        "bf16_fprop": bench(lambda: torch.matmul(x, bf16.t())),
        "bf16_dgrad": bench(lambda: torch.matmul(grad, bf16)),
        "bf16_wgrad": bench(lambda: torch.matmul(grad.t(), x)),
    }


def linear_rows() -> list[dict]:
    rows = []
    for name, (n, k) in LAYERS["llama3.1-8b"].items():
        times = _linear_times(n, k)
        flops = 6 * TOKENS * n * k
        row = {"layer": name, "n": n, "k": k, "tokens": TOKENS}
        for key, ms in times.items():
            row[f"{key}_ms"], row[f"{key}_tflops"] = ms, flops / ms / 1e9
            row[f"{key}_speedup"] = times["bf16"] / ms
        row["breakdown_ms"] = _breakdown(n, k)
        rows.append(row)
        print(f"  linear {name:8s} bf16 {times['bf16']:.3f} ms  fp8 {times['fp8']:.3f} ms "
              f"({row['fp8_speedup']:.2f}x) {row['breakdown_ms']}", flush=True)  # fmt: skip
    return rows


def config_sweep() -> list[dict]:
    """Fast-path Triton tile configs (informational) and whether they agree bitwise with exact."""
    configs = [
        gemm_triton.TileConfig(64, 64, 4, 4), gemm_triton.TileConfig(64, 128, 4, 4),
        gemm_triton.TileConfig(128, 128, 8, 3), gemm_triton.TileConfig(64, 128, 4, 5),
        gemm_triton.TileConfig(64, 128, 4, 3), gemm_triton.TileConfig(128, 128, 8, 4),
    ]  # fmt: skip
    rows = []
    for n, k in ((4096, 4096), (28672, 4096)):
        wq = per_block_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        for m in (4096,):
            xq = quant_triton.per_token_group_quant_triton(
                torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            )
            ref = gemm_triton.fp8_gemm_triton(xq, wq, out_dtype=torch.float32, exact=True)
            for cfg in configs:
                try:
                    out = gemm_triton.fp8_gemm_triton(xq, wq, out_dtype=torch.float32, config=cfg)
                    ms = bench(
                        lambda xq=xq, wq=wq, cfg=cfg: gemm_triton.fp8_gemm_triton(
                            xq, wq, out_dtype=torch.bfloat16, config=cfg
                        ),
                        rep=30,
                    )
                    rows.append({"n": n, "k": k, "m": m, "config": str(cfg), "tflops": 2 * m * n * k / ms / 1e9,
                                 "bitwise_equal_to_exact": bool(torch.equal(out, ref))})  # fmt: skip
                except Exception as err:  # a config that does not compile is a result too
                    rows.append(
                        {"n": n, "k": k, "m": m, "config": str(cfg), "error": repr(err)[:200]}
                    )
    return rows


def markdown(
    env: dict, ceil: dict, quant: list, gemm: list, linear: list, sweep: list, qsweep: list
) -> str:
    lines = [
        f"# fp8rl kernels on {env['gpu']}",
        "",
        f"Date {env['date']}; torch {env['torch']} (CUDA {env['cuda']}), triton {env['triton']}, "
        f"Python {env['python']}; default backend `{env['backend']}`, exact backend "
        f"`{env['backend_exact']}`. Produced by `benchmarks/kernels.py` (do_bench medians, L2 "
        "flushed, random normal data).",
        "",
        f"Ceilings measured in the same run: device copy {ceil['copy_tbps']:.2f} TB/s; BF16 8192³ "
        f"matmul {ceil['bf16_8192_tflops']:.0f} TFLOP/s.",
        "",
        "## Quantizers (Triton; bytes read + written)",
        "",
        "| op | shape | µs | TB/s |",
        "|---|---|---:|---:|",
    ]
    lines += [
        f"| {r['op']} | {r['shape']} | {r['ms'] * 1e3:.1f} | {r['tbps']:.2f} |" for r in quant
    ]
    lines += [
        "",
        "## GEMMs: TFLOP/s (speedup over BF16 torch.matmul)",
        "",
        "`default` = `fp8_gemm` dispatcher (scaled_mm/cuBLASLt blockwise on the H200), `triton` = "
        "fast Triton config, `exact` = batch-invariant Triton config, `fp8_linear` = 1×128 "
        "quantization + default GEMM with its NaN/inf check synced per call, `deferred` = the same "
        "inside `deferred_finite_checks()` (one sync at the end, what the trainers run), "
        "`unchecked` = `check_finite=False`. M ≤ 256: every variant replayed from a CUDA graph "
        "over several weight copies (> L2), i.e. kernel time without Python/launch overhead (no "
        "check runs in a graph); M ≥ 4096: eager do_bench. Operands are pre-quantized except in "
        "the three `fp8_linear` columns.",
        "",
        "| model | layer | M | N | K | bf16 | default | triton | exact | fp8_linear | deferred | "
        "unchecked |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in gemm:
        cells = [f"{r[f'{key}_tflops']:.1f} ({r[f'{key}_speedup']:.2f}×)" for key in KEYS]
        refused = " †" if r["default_refused"] else ""
        lines.append(f"| {r['model']} | {r['layer']} | {r['m']} | {r['n']} | {r['k']} | {r['bf16_tflops']:.1f} | "
                     f"{cells[0]}{refused} | " + " | ".join(cells[1:]) + " |")  # fmt: skip
    lines += [
        "",
        "† the library backend refused this shape; the dispatcher ran the Triton kernel.",
        "",
        f"## FP8Linear forward+backward vs BF16 nn.Linear (Llama-3.1-8B shapes, {TOKENS} tokens)",
        "",
        "`fp8` reuses the step's cached weight quantization (the training regime: once per optimizer "
        "step) and checks finiteness (2 host syncs per layer); `fp8_requant` re-quantizes the "
        "weight every call; `fp8_nocheck` has `check_finite=False`; `exact` is the "
        "batch-invariant mode. Eager mode (no CUDA graph), bf16 master weights, no bias.",
        "",
        "| layer | N | K | bf16 ms | fp8 ms (speedup) | fp8_requant | fp8_nocheck | exact |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in linear:
        cells = [
            f"{r[f'{key}_ms']:.3f} ({r[f'{key}_speedup']:.2f}×)"
            for key in ("fp8", "fp8_requant", "fp8_nocheck", "fp8_exact")
        ]
        lines.append(
            f"| {r['layer']} | {r['n']} | {r['k']} | {r['bf16_ms']:.3f} | "
            + " | ".join(cells)
            + " |"
        )
    lines += [
        "",
        "Pieces (ms, eager do_bench): FP8 GEMMs FProp / DGrad / WGrad (default backend) and the sum "
        "of the four quantizer kernels, against the three BF16 matmuls.",
        "",
        "| layer | fp8 fprop | fp8 dgrad | fp8 wgrad | quantizers | bf16 fprop | bf16 dgrad | bf16 wgrad |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in linear:
        b = r.get("breakdown_ms", {})
        keys = (
            "fprop_gemm",
            "dgrad_gemm",
            "wgrad_gemm",
            "quantizers",
            "bf16_fprop",
            "bf16_dgrad",
            "bf16_wgrad",
        )
        lines.append(
            f"| {r['layer']} | "
            + " | ".join(f"{b.get(key, float('nan')):.3f}" for key in keys)
            + " |"
        )
    lines += [
        "",
        "## Triton tile configs (informational)",
        "",
        "| N×K | M | config | TFLOP/s | bitwise = exact |",
        "|---|---:|---|---:|---|",
    ]
    for r in sweep:
        value = (
            f"{r['tflops']:.1f} | {r['bitwise_equal_to_exact']}"
            if "tflops" in r
            else f"error | {r['error'][:60]}"
        )
        lines.append(f"| {r['n']}×{r['k']} | {r['m']} | {r['config']} | {value} |")
    if qsweep:
        lines += [
            "",
            "## Quantizer tile variants (informational)",
            "",
            "| variant | shape | µs | TB/s |",
            "|---|---|---:|---:|",
        ]
        lines += [
            f"| {r['op']} | {r['shape']} | {r['ms'] * 1e3:.1f} | {r['tbps']:.2f} |" for r in qsweep
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results"), help="output folder"
    )
    parser.add_argument(
        "--only-quantizers", action="store_true", help="ceilings + quantizer tables only"
    )
    parser.add_argument(
        "--only-gemms", action="store_true", help="ceilings + the GEMM / fp8_linear table only"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    warnings.simplefilter("always")
    env = environment()
    print(env, flush=True)
    ceil = ceilings()
    print(ceil, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    slug = env["gpu"].split()[-1].lower()
    if args.only_gemms:
        gemm = gemm_rows()
        (args.out / f"kernels-{slug}-gemms.json").write_text(json.dumps(gemm, indent=1))
        text = markdown(env, ceil, [], gemm, [], [], [])
        (args.out / f"kernels-{slug}-gemms.md").write_text(text)
        print(text.split("## GEMMs")[1].split("## FP8Linear")[0])
        return 0
    quant = quantizer_rows()
    qsweep = quantizer_sweep()
    if args.only_quantizers:
        text = markdown(env, ceil, quant, [], [], [], qsweep)
        (args.out / f"kernels-{slug}-quantizers.md").write_text(text)
        print(text)
        return 0
    gemm = gemm_rows()
    linear = linear_rows()
    sweep = config_sweep()
    env["refused_shape_classes"] = [str(key) for key in sorted(gemm_module._REFUSED, key=str)]
    (args.out / f"kernels-{slug}.md").write_text(
        markdown(env, ceil, quant, gemm, linear, sweep, qsweep)
    )
    (args.out / f"kernels-{slug}.json").write_text(
        json.dumps(
            {
                "env": env,
                "ceilings": ceil,
                "quantizers": quant,
                "gemm": gemm,
                "linear": linear,
                "sweep": sweep,
                "quantizer_sweep": qsweep,
            },
            indent=1,
        )
    )
    short = [r for r in gemm if r["m"] in (1, 128, 256, 4096, 16384)]
    print(markdown(env, ceil, quant, short, linear, [], qsweep).split("## GEMMs")[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
