"""Where a native-engine decode step's wall time goes beyond the captured graph (issue 14).

    python benchmarks/decode_overhead.py --layers 32 --batch 64 --gen 512 [--modes bf16 unified_fp8]

Random Llama-3.1-8B-shaped weights, CUDA graphs on. Per mode it times, in ms per decode step:

* ``generate``: the decode loop of ``NativeEngine.generate`` (EOS off), over ``--gen`` steps, twice
  with the same engine (the first call also compiles; both capture one graph per KV bucket);
* ``capture``: the seconds spent capturing graphs inside the second call, and their count;
* ``replay``: the captured step alone (forward, lm_head, draw, logprob), replayed back to back
  at the mean context's bucket;
* ``eager sample``: ``sample_tokens`` + ``token_logprobs`` + the two ``tolist`` of one step on
  random logits, back to back: what the engine ran per step outside the graph before the draw
  moved into it (2026-12-04).

``other`` = generate − replay − capture/steps: what the GPU waits for the host.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from rollout import DecodeClock, build

from fp8rl.kernels.invariant import token_logprobs
from fp8rl.protocol import SamplingParams
from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.model.decoder import KVCache
from fp8rl.workers.rollout import cuda_graphs
from fp8rl.workers.rollout.engine import KV_BUCKET, NativeEngine
from fp8rl.workers.rollout.sampling import sample_tokens


class CaptureClock:
    """Wraps ``GraphDecoder._capture`` to add up its wall time (synchronized)."""

    def __init__(self) -> None:
        self.seconds, self.count = 0.0, 0
        self._inner = cuda_graphs.GraphDecoder._capture

    def __enter__(self):
        clock = self

        def timed(decoder, limit):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = clock._inner(decoder, limit)
            torch.cuda.synchronize()
            clock.seconds += time.perf_counter() - t0
            clock.count += 1
            return out

        cuda_graphs.GraphDecoder._capture = timed
        return self

    def __exit__(self, *exc) -> None:
        cuda_graphs.GraphDecoder._capture = self._inner


def generate_ms(engine, loop: DecodeClock, prompts, gen: int) -> tuple[float, CaptureClock]:
    """ms per step of the decode loop of one ``generate`` call, and its graph captures."""
    loop.reset()
    with CaptureClock() as clock:
        engine.generate(prompts, SamplingParams(n=1, max_tokens=gen, temperature=1.0, seed=0))
    return loop.seconds / gen * 1e3, clock


@torch.inference_mode()
def replay_ms(model, cfg, batch: int, context: int, steps: int) -> float:
    limit = -(-context // KV_BUCKET) * KV_BUCKET
    cache = KVCache.allocate(cfg, batch=batch, capacity=limit, dtype=torch.bfloat16, device="cuda")
    sampling = SamplingParams(n=1, max_tokens=1, temperature=1.0, seed=0)
    graphs = cuda_graphs.GraphDecoder(model, cache, batch, sampling)
    tokens = torch.randint(0, cfg.vocab_size, (batch,), device="cuda")
    pos = torch.full((batch,), context - 1, device="cuda")
    graphs(tokens, pos, torch.full((batch,), 0.5, dtype=torch.float64, device="cuda"), limit)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        graphs.graphs[limit][0].replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e3


@torch.inference_mode()
def sample_ms(cfg, batch: int, steps: int) -> float:
    logits = torch.randn(batch, cfg.vocab_size, device="cuda", dtype=torch.bfloat16)
    seeds = torch.arange(batch, device="cuda")

    def step(i: int) -> None:
        tokens = sample_tokens(logits, temperature=1.0, seeds=seeds, step=i)
        logps = token_logprobs(logits, tokens, temperature=1.0)
        tokens.tolist(), logps.tolist()

    step(0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="llama-3.1-8b", choices=sorted(PRESETS))
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--batch", type=int, nargs="+", default=[64])
    parser.add_argument("--gen", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--modes", nargs="+", default=["bf16", "unified_fp8"])
    args = parser.parse_args()
    cfg = dataclasses.replace(PRESETS[args.preset], num_hidden_layers=args.layers)
    context = args.prompt + args.gen // 2
    rows = []
    for mode in args.modes:
        model = build(cfg, mode, args.prompt + args.gen + 8, "cuda", kv_fp8=False, exact=False)
        for batch in args.batch:
            engine = NativeEngine(model, eos_token_ids=[], max_batch_size=batch, cuda_graphs=True)
            loop = DecodeClock(engine, "cuda")
            prompts = torch.randint(0, cfg.vocab_size, (batch, args.prompt)).tolist()
            engine.generate(prompts[:2], SamplingParams(n=1, max_tokens=8, seed=0))  # not batch
            first, _ = generate_ms(engine, loop, prompts, args.gen)
            second, clock = generate_ms(engine, loop, prompts, args.gen)
            replay = replay_ms(model, cfg, batch, context, 50)
            sample = sample_ms(cfg, batch, 50)
            capture = clock.seconds * 1e3 / args.gen
            row = (mode, batch, first, second, clock.count, clock.seconds, replay, sample,
                   second - replay - capture)  # fmt: skip
            rows.append(row)
            print("row", *(f"{v:.3f}" if isinstance(v, float) else v for v in row), flush=True)
        del model
        torch.cuda.empty_cache()
    print(f"\n{args.layers} layers, prompt {args.prompt}, gen {args.gen}; ms per decode step")
    print(
        "| mode | batch | generate 1st | generate 2nd | captures (s) | replay | eager sample | other |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for mode, b, g1, g2, n, s, r, smp, other in rows:
        print(f"| {mode} | {b} | {g1:.2f} | {g2:.2f} | {n} ({s:.2f}) | {r:.2f} | {smp:.2f} | "
              f"{other:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
