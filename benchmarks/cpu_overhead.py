"""Host (CPU) time per eager FP8 linear call, by component (issue 14: the M ≥ 4096 linear is
bound by Python and launch time, not by the GPU).

    python benchmarks/cpu_overhead.py [--m 4096] [--calls 200]

Each component runs ``--calls`` times back to back; "cpu µs" is the host time per call before
the final synchronize (the launch queue never fills at these counts), "wall µs" includes it.
When cpu ≥ device time the call is host-bound. Prints one table; ``--out`` also writes it.
``--host-profile`` adds a cProfile table of ``FP8Linear`` forward + backward (own host µs per
call by function: what to trim when a small micro-batch step is host-bound).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from fp8rl.kernels import fp8_gemm, fp8_linear, per_block_quant, quant_triton
from fp8rl.kernels.finite import deferred_finite_checks
from fp8rl.kernels.gemm import _recipe, scaled_mm_scales

SHAPES = {"llama_qkv": (6144, 4096), "qwen_qkv": (4608, 3584), "qwen_o": (3584, 3584)}


def per_call(fn, calls: int) -> tuple[float, float]:
    """(host µs, wall µs) per call of ``fn`` over ``calls`` back-to-back calls."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return host / calls * 1e6, wall / calls * 1e6


def components(n: int, k: int, m: int) -> dict:
    """The callables timed for one (N, K) at M rows."""
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    wq = per_block_quant(w)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xq = quant_triton.per_token_group_quant_triton(x)
    a, b = xq.codes, wq.codes.t()
    sa, sb = scaled_mm_scales(xq), scaled_mm_scales(wq)
    ra, rb = _recipe(xq.block), _recipe(wq.block)
    kern = quant_triton._per_token_group_quant_kernel
    codes = torch.empty(m, k, dtype=torch.float8_e4m3fn, device="cuda")
    scale = torch.empty(k // 128, m, dtype=torch.float32, device="cuda")
    args = (x, codes, scale, m, k, x.stride(0), codes.stride(0), scale.stride(0))
    grid = (k // 128, triton_cdiv(m, 32))
    meta = {"POW2": False, "BLOCK_R": 32, "GROUPS": 1}
    compiled = kern[grid](*args, **meta, num_warps=4)

    def deferred():
        with deferred_finite_checks():
            fp8_linear(x, wq)

    return {
        "bf16 matmul": lambda: torch.matmul(x, w.t()),
        "torch.empty x2": lambda: (torch.empty_like(codes), torch.empty_like(scale)),
        "triton jit launch": lambda: kern[grid](*args, **meta, num_warps=4),
        "triton compiled launch": lambda: compiled[(*grid, 1)](*args, *meta.values()),
        "quant wrapper": lambda: quant_triton.per_token_group_quant_triton(x),
        "amax sum (deferred check)": lambda: xq.scale.sum(dtype=torch.float64),
        "_scaled_mm_v2": lambda: torch._scaled_mm_v2(
            a, b, [sa], [ra.value], [], [sb], [rb.value], [], None, torch.bfloat16, [], False
        ),
        "F.scaled_mm": lambda: torch.nn.functional.scaled_mm(
            a, b, sa, ra, sb, rb, output_dtype=torch.bfloat16
        ),
        "fp8_gemm": lambda: fp8_gemm(xq, wq, out_dtype=torch.bfloat16),
        "fp8_linear unchecked": lambda: fp8_linear(x, wq, check_finite=False),
        "fp8_linear deferred": deferred,
    }


def host_profile(n: int, k: int, m: int, calls: int, count: int = 20) -> str:
    """cProfile of ``calls`` eager ``FP8Linear`` forward + backward calls (the trainer's path,
    inside ``deferred_finite_checks``): the functions with the most own host time per call."""
    import cProfile
    import pstats

    from fp8rl.kernels import FP8Linear

    layer = FP8Linear(k, n, bias=False, device="cuda", dtype=torch.float32)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def once():
        with deferred_finite_checks():
            layer(x).sum().backward()

    once()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        once()
    torch.cuda.synchronize()
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    rows = sorted(
        ((own, cum, n_calls, f"{Path(f).name}:{line} {name}")
         for (f, line, name), (_, n_calls, own, cum, _) in stats.items()),
        reverse=True,
    )[:count]  # fmt: skip
    lines = [f"| own µs/call | cum µs/call | calls/call | function (FP8Linear fwd+bwd, M = {m}, N×K = {n}×{k}) |",
             "|---|---|---|---|"]  # fmt: skip
    lines += [
        f"| {own / calls * 1e6:.1f} | {cum / calls * 1e6:.1f} | {c / calls:.0f} | {name} |"
        for own, cum, c, name in rows
    ]
    return "\n".join(lines)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--host-profile", action="store_true", help="also cProfile FP8Linear fwd+bwd (qwen_qkv)"
    )
    args = parser.parse_args()
    table = {name: components(n, k, args.m) for name, (n, k) in SHAPES.items()}
    rows = []
    names = list(next(iter(table.values())))
    for comp in names:
        cells = []
        for shape in table:
            try:
                host, wall = per_call(table[shape][comp], args.calls)
                cells.append(f"{host:.0f} / {wall:.0f}")
            except Exception as err:  # a component the installed torch/Triton lacks
                cells.append(f"n/a ({type(err).__name__})")
        rows.append(f"| {comp} | " + " | ".join(cells) + " |")
    head = f"| component (host µs / wall µs per call, M = {args.m}) | " + " | ".join(table) + " |"
    text = "\n".join([head, "|---" * (len(table) + 1) + "|", *rows])
    if args.host_profile:
        text += "\n\n" + host_profile(*SHAPES["qwen_qkv"], args.m, args.calls)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "cpu-overhead.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
