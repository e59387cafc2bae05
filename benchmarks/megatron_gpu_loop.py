"""A GRPO run of a few steps on one GPU without Ray, with either trainer backend.

    python benchmarks/megatron_gpu_loop.py [--backends native megatron] [--steps 4] [--exact true]

The classes the Ray actors wrap, driven in one process: ``MegatronTrainer`` (TP = PP = DP = 1) or
the native ``TrainerWorker``, and the native ``RolloutWorker`` (random ``small-llama``, unified
FP8, BF16 KV cache: the Megatron backend refuses an FP8 one). Per step: publish → apply →
generate (8 prompts × 4 samples) → reward (the share of even token ids in the response, a toy
rule) → GRPO group-normalised advantages → trainer logprobs (old = current policy) → train.
Printed per step: engine-vs-trainer max |Δlogp| over response tokens (0 in exact mode), mean
reward, pg_loss, grad norm, and the seconds of each phase. Not the Ray driver: no placement,
no reward actor, no checkpointing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from fp8rl.protocol import Prompt, RolloutRequest, SamplingParams, parse_job_spec
from fp8rl.workers.algorithms.advantages import group_normalized_advantages
from fp8rl.workers.model.scoring import pack
from fp8rl.workers.ports import free_port
from fp8rl.workers.trainer.batch import TrainBatch

N, PROMPTS = 4, 8


def _trainer(backend: str, job, steps: int, device: str):
    kw = {"total_steps": steps, "batch_size": N * PROMPTS, "device": device, "seed": 0}
    if backend == "megatron":
        from fp8rl.workers.trainer.megatron.trainer import MegatronTrainer

        return MegatronTrainer(
            job.model, job.trainer, job.algorithm, job.precision, port=free_port(), **kw
        )
    from fp8rl.workers.trainer.worker import TrainerWorker

    return TrainerWorker(job.model, job.trainer, job.algorithm, job.precision, **kw)


def run(
    backend: str, *, steps: int, exact: bool, max_tokens: int, model: str, device: str
) -> list[dict]:
    """``steps`` GRPO steps; one dict of measurements per step."""
    from fp8rl.workers.rollout.worker import RolloutWorker

    overrides = [
        f"model.path=random:{model}",
        "model.max_model_len=512",
        "precision.mode=unified_fp8",
        f"precision.exact={str(exact).lower()}",
        f"rollout.n={N}",
        f"rollout.max_tokens={max_tokens}",
        "data.max_prompt_tokens=64",
        "trainer.micro_batch_size=16",
        "trainer.lr=1e-4",
        f"trainer.backend={backend}",
    ]
    job = parse_job_spec("", overrides)
    trainer = _trainer(backend, job, steps, device)
    wait = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    vocab = trainer.source.config.vocab_size
    engine = RolloutWorker(job.model, job.rollout, job.precision, device=device, seed=0)
    gen = torch.Generator().manual_seed(0)
    prompts = [
        Prompt(
            prompt_id=str(i),
            token_ids=torch.randint(
                3, vocab, (int(torch.randint(8, 48, (1,), generator=gen)),), generator=gen
            ).tolist(),
        )
        for i in range(PROMPTS)
    ]
    rows = []
    for step in range(steps):
        t: dict = {"backend": backend, "exact": exact, "step": step}
        t0 = time.perf_counter()
        update, handle = trainer.publish()
        engine.apply_weights(update, handle)
        t["sync_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        result = engine.generate(
            RolloutRequest(
                request_id=str(step),
                prompts=prompts,
                sampling=SamplingParams(n=N, max_tokens=max_tokens, seed=step),
            )
        )
        t["generate_s"] = time.perf_counter() - t0
        samples = result.samples
        packed = pack([s.prompt_token_ids for s in samples], [s.token_ids for s in samples])
        rollout = torch.zeros(packed.response_ids.shape)
        for i, s in enumerate(samples):
            rollout[i, : len(s.logprobs)] = torch.tensor(s.logprobs)
        rewards = torch.tensor(
            [sum(1 for x in s.token_ids if x % 2 == 0) / max(len(s.token_ids), 1) for s in samples],
            dtype=torch.float64,
        )
        adv = group_normalized_advantages(rewards, group_size=N, std_normalize=True, std_floor=1e-6)
        mask = packed.response_mask
        batch = TrainBatch(
            packed, rollout, rollout, adv.float()[:, None] * mask, None, result.policy_version, 1.0
        )
        t0 = time.perf_counter()
        batch.old_logp = trainer.logprobs(batch)
        wait()
        t["score_s"] = time.perf_counter() - t0
        t["max_abs_dlogp"] = float(((batch.old_logp - rollout).abs() * mask).max())
        t["tokens"] = int(mask.sum())
        t["reward"] = float(rewards.mean())
        t0 = time.perf_counter()
        metrics = trainer.train(batch)
        wait()
        t["train_s"] = time.perf_counter() - t0
        t["pg_loss"] = metrics["actor/pg_loss"]
        t["grad_norm"] = metrics["actor/grad_norm"]
        rows.append(t)
        print(json.dumps(t), flush=True)
    if backend == "megatron":
        from fp8rl.workers.trainer.megatron.parallel import shutdown_parallel

        shutdown_parallel()
    del trainer, engine
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["native", "megatron"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--exact", nargs="+", default=["true"])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--model", default="small-llama")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = [
        r
        for exact in args.exact
        for backend in args.backends
        for r in run(
            backend,
            steps=args.steps,
            exact=exact == "true",
            max_tokens=args.max_tokens,
            model=args.model,
            device=args.device,
        )
    ]
    table = [
        "| backend | exact | step | tokens | reward | max abs dlogp | pg_loss | grad norm | "
        "sync s | generate s | score s | train s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    table += [
        f"| {r['backend']} | {r['exact']} | {r['step']} | {r['tokens']} | {r['reward']:.4f} | "
        f"{r['max_abs_dlogp']:.3g} | {r['pg_loss']:.6g} | {r['grad_norm']:.6g} | "
        f"{r['sync_s']:.2f} | {r['generate_s']:.2f} | {r['score_s']:.3f} | {r['train_s']:.3f} |"
        for r in rows
    ]
    print("\n".join(table))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "megatron_gpu_loop.md").write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
