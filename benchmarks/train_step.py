"""Trainer step speed: BF16 vs unified FP8 on a Llama-3.1-8B-shaped model (issue 14).

    python benchmarks/train_step.py --layers 8 --tokens 16384 32768 --out results/

One step = forward over ``tokens`` (sequences of ``--seq``), the mean token log-probability
(lm_head + log-softmax, the trainer's scoring composition), backward and a fused AdamW step on
float32 master weights. Random weights and ids (speed only). Reports the median step time of
``--steps`` timed steps after one warm-up, the peak memory, and with ``--profile`` the top
device kernels of one step (with their total) and the Python functions with the most own host
time (cProfile): a step whose wall time is well above its kernel time is host-bound. The
profiles run after the timing; a later row of the same process runs slower after them.

``--grouped on off``: FP8 rows with q/k/v and gate/up as one GEMM per pass
(``kernels.linear_group``, the default) and per module (the path before it).

``--variant new old``: the step as the trainers run it since 2026-12-04 night (``new``) and/or
as before (``old``): the FP32 lm_head cast to BF16 per chunk and per recompute instead of once
per pass (``Decoder.head``), the fast mode's float32 ``log_softmax`` instead of the Triton rows
(``invariant.set_fast_logprobs``), and the fast RMSNorm / SwiGLU backward differentiating the
recomputed torch composition instead of one Triton pass each (``fused.set_triton_backward``).
Exact mode's log-softmax rows were Triton already, and their new Triton backward has no switch.

``--checks``: the quantizers' NaN/inf check in FP8 rows: ``deferred`` (what the trainers run:
one host sync after the backward), ``sync`` (one host sync per quantization, the trainer before
issue 14's deferral) or ``off``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch

from fp8rl.kernels import attention_cudnn_bwd, deferred_finite_checks
from fp8rl.kernels.fused import set_triton_backward
from fp8rl.kernels.invariant import set_fast_attention, set_fast_logprobs
from fp8rl.kernels.linear_group import set_grouped
from fp8rl.protocol import QuantConfig
from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.model.linear import LayerPrecision


def build(cfg, mode: str, exact: bool, seq: int, checks: str, variant: str = "new"):
    fp8 = mode == "unified_fp8"
    precision = LayerPrecision(
        dtype=torch.bfloat16, fp8=fp8, quant=QuantConfig() if fp8 else None, exact=exact
    )
    model = build_decoder(
        cfg, precision, state_dict=None, max_positions=seq, param_dtype=torch.float32, device="cuda"
    )
    for module in model.modules():
        if hasattr(module, "check_finite"):
            module.check_finite = checks != "off"
    if variant == "old":  # the head cast per call, as before Decoder.head
        model.head = lambda tied_head=None: (partial(model.logits, tied_head=tied_head), None)
    return model.train()


def step(model, optimizer, ids: torch.Tensor, checks: str = "off") -> None:
    batch, seq = ids.shape
    pos = torch.arange(seq, device="cuda").expand(batch, seq)
    with deferred_finite_checks() if checks == "deferred" else nullcontext():
        hidden = model(ids, pos, torch.full((batch,), seq, device="cuda"))
        logp = model.token_logprobs(hidden[:, :-1], ids[:, 1:], temperature=1.0)
        (-logp.mean()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for module in model.modules():  # fused AdamW does not bump the weights' version counters:
        if hasattr(module, "invalidate_quantized"):  # re-quantize next step, as the trainer does
            module.invalidate_quantized()


def top_kernels(model, optimizer, ids, checks: str, count: int = 30) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(model, optimizer, ids, checks)
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in events) or 1.0
    return [{"kernel": "(all kernels)", "ms": total / 1e3, "share": 1.0}] + [
        {
            "kernel": e.key[:90],
            "ms": e.device_time_total / 1e3,
            "share": e.device_time_total / total,
        }
        for e in events[:count]
    ]


def top_host_functions(model, optimizer, ids, checks: str, count: int = 25) -> list[dict]:
    """cProfile of one step: the Python functions with the most own (host) time."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    step(model, optimizer, ids, checks)
    torch.cuda.synchronize()
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    rows = [
        {"function": f"{Path(f).name}:{line} {name}", "calls": calls, "own_ms": own * 1e3,
         "cum_ms": cum * 1e3}
        for (f, line, name), (_, calls, own, cum, _) in stats.items()
    ]  # fmt: skip
    return sorted(rows, key=lambda r: r["own_ms"], reverse=True)[:count]


def measure(
    cfg, mode: str, tokens: int, seq: int, steps: int, exact: bool, checks: str, profile: bool,
    variant: str = "new",
) -> dict:  # fmt: skip
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    set_fast_logprobs("torch" if variant == "old" else "triton")
    set_triton_backward(variant == "new")
    model = build(cfg, mode, exact, seq, checks, variant)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    ids = torch.randint(0, cfg.vocab_size, (tokens // seq, seq), device="cuda")
    row = {"mode": mode, "exact": exact, "checks": checks, "tokens": tokens, "variant": variant}
    row["layers"] = cfg.num_hidden_layers
    try:
        step(model, optimizer, ids, checks)  # warm-up (compiles kernels, allocates optimizer state)
        torch.cuda.synchronize()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step(model, optimizer, ids, checks)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        row["step_s"] = sorted(times)[len(times) // 2]
        row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        if profile:
            row["top_kernels"] = top_kernels(model, optimizer, ids, checks)
            row["top_host"] = top_host_functions(model, optimizer, ids, checks)
    except torch.OutOfMemoryError as err:
        row["step_s"], row["peak_gib"], row["error"] = float("nan"), float("nan"), str(err)[:120]
    del model, optimizer
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="llama-3.1-8b", choices=sorted(PRESETS))
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, nargs="+", default=[16384, 32768])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["bf16", "unified_fp8"])
    parser.add_argument("--exact", action="store_true", help="also run unified FP8 exact")
    parser.add_argument(
        "--checks", nargs="+", default=["deferred"], choices=["deferred", "sync", "off"]
    )
    parser.add_argument("--profile", action="store_true", help="top kernels at the first size")
    parser.add_argument(
        "--grouped",
        nargs="+",
        default=["on"],
        choices=["on", "off"],
        help="FP8 rows with q/k/v and gate/up as one GEMM (on, the default) and/or per module",
    )
    parser.add_argument(
        "--attention",
        default="triton",
        choices=["triton", "sdpa"],
        help="fast mode's attention on CUDA (kernels.invariant.set_fast_attention): the "
        "invariant Triton kernel (default; the engine reads the KV cache in place) or SDPA",
    )
    parser.add_argument(
        "--attention-bwd",
        default="cudnn",
        choices=["cudnn", "triton"],
        help="the trainer's attention backward (kernels.attention_cudnn_bwd): cuDNN's from the "
        "invariant forward's output and log-sum-exp (default, where it applies) or the Triton "
        "dQ / dK-dV kernels",
    )
    parser.add_argument(
        "--variant",
        nargs="+",
        default=["new"],
        choices=["new", "old"],
        help="the step as run since 2026-12-04 night (new: head cast once, Triton log-softmax, "
        "Triton norm/SwiGLU backward) and/or as before (old)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    set_fast_attention(args.attention)
    attention_cudnn_bwd.set_enabled(args.attention_bwd == "cudnn")
    cfg = dataclasses.replace(PRESETS[args.preset], num_hidden_layers=args.layers)
    fp8 = [("unified_fp8", False)] if "unified_fp8" in args.modes else []
    fp8 += [("unified_fp8", True)] if args.exact else []
    runs = [(m, False, "off", "on") for m in args.modes if m != "unified_fp8"]  # no quantizer
    runs += [
        (m, exact, checks, grouped)
        for m, exact in fp8
        for checks in args.checks
        for grouped in args.grouped
    ]
    rows = []
    for i, tokens in enumerate(args.tokens):
        for (mode, exact, checks, grouped), variant in itertools.product(runs, args.variant):
            prof = args.profile and i == 0
            set_grouped(grouped == "on")
            rows.append(
                measure(cfg, mode, tokens, args.seq, args.steps, exact, checks, prof, variant)
            )
            rows[-1]["grouped"] = grouped
            print(
                json.dumps({k: v for k, v in rows[-1].items() if not k.startswith("top_")}),
                flush=True,
            )
    lines = [
        f"# Train step — {args.preset}, {args.layers} layers, seq {args.seq}, "
        f"fast attention {args.attention}, attention backward {args.attention_bwd}",
        f"{time.strftime('%Y-%m-%d')} · {torch.cuda.get_device_name()} · torch {torch.__version__}",
        "",
        "| mode | exact | NaN checks | q/k/v, gate/up grouped | variant | tokens | step s | vs BF16 | peak GiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = [
            x
            for x in rows
            if x["mode"] == "bf16" and x["tokens"] == r["tokens"] and x["variant"] == r["variant"]
        ]
        ratio = f"{base[0]['step_s'] / r['step_s']:.2f}×" if base else "—"  # no BF16 row run
        lines.append(
            f"| {r['mode']} | {r['exact']} | {r['checks']} | {r['grouped']} | {r['variant']} | {r['tokens']} | {r['step_s']:.3f} | "
            f"{ratio} | {r['peak_gib']:.1f} |"
        )
    for r in rows:
        for k in r.get("top_kernels", []):
            lines.append(
                f"- {r['mode']} exact={r['exact']} checks={r['checks']} grouped={r['grouped']} variant={r['variant']}: {k['ms']:.1f} ms ({k['share']:.0%}) {k['kernel']}"
            )
    for r in rows:
        for f in r.get("top_host", []):
            lines.append(
                f"- host {r['mode']} checks={r['checks']} grouped={r['grouped']} variant={r['variant']}: own {f['own_ms']:.1f} ms, cum {f['cum_ms']:.1f} ms, {f['calls']} calls: {f['function']}"
            )
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "train-step.json").write_text(json.dumps(rows, indent=1))
        (args.out / "train-step.md").write_text(table)


if __name__ == "__main__":
    main()
