"""Where the exact (bitwise) mode spends its time: top device kernels of one train step and of
decode steps, exact vs fast (issue 14).

    python benchmarks/exact_profile.py --layers 8 --tokens 16384 --batch 64 --steps 16

Train step: ``train_step.step`` (forward, lm_head + log-softmax, backward, AdamW) over
``--tokens`` as sequences of ``--seq``. Decode: ``--steps`` KV-cache decode steps of the batch
(decoder forward of one token, lm_head, log-softmax, no CUDA graphs) after a ``--prompt`` prefill.
Prints, per mode, the top kernels with their device time and share.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from rollout import build as build_rollout
from train_step import build as build_train
from train_step import step

from fp8rl.kernels.invariant import token_logprobs
from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.model.decoder import KVCache


def top(prof, count: int) -> list[str]:
    events = sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in events) or 1.0
    lines = [f"  total device {total / 1e3:.1f} ms"]
    for e in events[:count]:
        t = e.device_time_total
        lines.append(f"  {t / 1e3:8.1f} ms {t / total:5.1%}  {e.key[:100]}")
    return lines


def train_profile(cfg, exact: bool, tokens: int, seq: int, count: int) -> list[str]:
    model = build_train(cfg, "unified_fp8", exact, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    ids = torch.randint(0, cfg.vocab_size, (tokens // seq, seq), device="cuda")
    step(model, opt, ids)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(model, opt, ids)
        torch.cuda.synchronize()
    del model, opt
    torch.cuda.empty_cache()
    return [f"train exact={exact} tokens={tokens}", *top(prof, count)]


def decode_profile(cfg, exact: bool, batch: int, prompt: int, steps: int, count: int):
    model = build_rollout(cfg, "unified_fp8", prompt + steps + 8, "cuda", kv_fp8=False, exact=exact)
    model.fuse_projections()
    with torch.inference_mode():
        return _decode(model, cfg, exact, batch, prompt, steps, count)


def _decode(model, cfg, exact: bool, batch: int, prompt: int, steps: int, count: int):
    cap = prompt + steps + 8
    cache = KVCache.allocate(cfg, batch=batch, capacity=cap, dtype=torch.bfloat16, device="cuda")
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device="cuda")
    pos = torch.arange(prompt, device="cuda").expand(batch, prompt)
    model(ids, pos, torch.full((batch,), prompt, device="cuda"), cache)
    tok = ids[:, -1:]

    def one(p: int) -> None:
        nonlocal tok
        hidden = model(
            tok,
            torch.full((batch, 1), p, device="cuda"),
            torch.full((batch,), p + 1, device="cuda"),
            cache,
        )
        logits = model.logits(hidden[:, 0])
        tok = logits.argmax(-1, keepdim=True)
        token_logprobs(logits, tok[:, 0], exact=exact)

    one(prompt)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            one(prompt + 1 + i)
        torch.cuda.synchronize()
    return [f"decode exact={exact} batch={batch} steps={steps}", *top(prof, count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="llama-3.1-8b", choices=sorted(PRESETS))
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--parts", nargs="+", default=["train", "decode"])
    parser.add_argument("--exact-only", action="store_true")
    args = parser.parse_args()
    cfg = dataclasses.replace(PRESETS[args.preset], num_hidden_layers=args.layers)
    modes = [True] if args.exact_only else [True, False]
    for exact in modes:
        if "decode" in args.parts:
            print(
                "\n".join(
                    decode_profile(cfg, exact, args.batch, args.prompt, args.steps, args.top)
                ),
                flush=True,
            )
        if "train" in args.parts:
            print("\n".join(train_profile(cfg, exact, args.tokens, args.seq, args.top)), flush=True)


if __name__ == "__main__":
    main()
