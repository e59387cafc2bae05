"""Where a decode step's device time goes: top kernels per step, BF16 vs unified FP8 (issue 14).

    python benchmarks/decode_profile.py [--layers 8] [--batch 64] [--context 384] [--steps 16]

Random Llama-3.1-8B-shaped weights, a prefill to ``--context`` tokens, then ``--steps`` eager
decode steps (model forward + lm_head + argmax, as the engine runs them inside its CUDA graph)
under the torch profiler. Prints µs per step per kernel (top ``--top``) and the total; ``--out``
writes the tables.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch
from rollout import build
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.model.decoder import KVCache


def profile_mode(
    cfg, mode: str, batch: int, context: int, steps: int, top: int, kv_fp8: bool = False
) -> str:
    model = build(cfg, mode, context + steps + 8, "cuda", kv_fp8=kv_fp8, exact=False)
    with torch.inference_mode():
        return _profile(model, cfg, mode, batch, context, steps, top, kv_fp8)


def _profile(
    model, cfg, mode: str, batch: int, context: int, steps: int, top: int, kv_fp8: bool
) -> str:
    cap = -(-(context + steps) // 128) * 128
    cache = KVCache.allocate(
        cfg, batch=batch, capacity=cap, dtype=torch.bfloat16, device="cuda", kv_fp8=kv_fp8
    )
    ids = torch.randint(0, cfg.vocab_size, (batch, context), device="cuda")
    pos = torch.arange(context, device="cuda").expand(batch, context)
    model(ids, pos, torch.full((batch,), context, device="cuda"), cache)
    tok = ids[:, -1:]

    def step(i: int) -> torch.Tensor:
        p = torch.full((batch, 1), context + i, device="cuda")
        hidden = model(tok, p, p[:, 0] + 1, cache, kv_limit=cap)
        return model.logits(hidden[:, -1]).argmax(-1, keepdim=True)

    for i in range(3):
        step(i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            tok = step(i)
        torch.cuda.synchronize()
    events = [
        e
        for e in prof.key_averages()
        if e.device_type == DeviceType.CUDA and e.device_time_total > 0
    ]
    events.sort(key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in events) / steps
    lines = [
        f"### {mode}, {'FP8' if kv_fp8 else 'BF16'} KV: {total:,.0f} µs of kernels per step "
        f"({cfg.num_hidden_layers} layers, "
        f"batch {batch}, context {context})",
        "",
        "| kernel | µs/step | calls/step | share |",
        "|---|---:|---:|---:|",
    ]
    for e in events[:top]:
        per = e.device_time_total / steps
        name = e.key.replace("|", "/")[:90]
        lines.append(f"| {name} | {per:,.1f} | {e.count / steps:.0f} | {100 * per / total:.0f}% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="llama-3.1-8b", choices=sorted(PRESETS))
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=384)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--modes", nargs="+", default=["bf16", "unified_fp8"])
    parser.add_argument("--kv", default="bf16", choices=["bf16", "fp8"], help="KV cache dtype")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cfg = dataclasses.replace(PRESETS[args.preset], num_hidden_layers=args.layers)
    tables = []
    for mode in args.modes:
        tables.append(
            profile_mode(
                cfg, mode, args.batch, args.context, args.steps, args.top, args.kv == "fp8"
            )
        )
        torch.cuda.empty_cache()
    text = "\n\n".join(tables)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "decode-profile.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
