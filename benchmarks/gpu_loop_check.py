"""The trainer ↔ engine loop on one GPU without Ray: publish → apply → generate → score → train.

    python benchmarks/gpu_loop_check.py [--steps 3] [--out DIR]

TrainerWorker and RolloutWorker (the classes the Ray actors wrap) on CUDA with a random 8-layer
Llama, unified FP8, exact kernels, FP8 KV cache: per step, the rollout/trainer max |Δlogp| (goal
0), the weight-update size, and the time of each phase.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from fp8rl.protocol import Prompt, RolloutRequest, SamplingParams, parse_job_spec
from fp8rl.workers.model.scoring import pack
from fp8rl.workers.rollout.worker import RolloutWorker
from fp8rl.workers.trainer.batch import TrainBatch
from fp8rl.workers.trainer.worker import TrainerWorker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    job = parse_job_spec(
        "",
        [
            "model.path=random:small-llama",
            "model.max_model_len=512",
            "precision.exact=true",
            "precision.quant.kv_cache_dtype=fp8_e4m3",
            "rollout.n=4",
            f"rollout.max_tokens={args.max_tokens}",
            "data.max_prompt_tokens=64",
            "trainer.micro_batch_size=16",
            "trainer.lr=1e-4",
        ],
    )
    trainer = TrainerWorker(
        job.model,
        job.trainer,
        job.algorithm,
        job.precision,
        total_steps=args.steps,
        batch_size=32,
        device=args.device,
        seed=0,
    )
    engine = RolloutWorker(job.model, job.rollout, job.precision, device=args.device, seed=0)
    gen = torch.Generator().manual_seed(0)
    prompts = [
        Prompt(
            prompt_id=str(i),
            token_ids=torch.randint(
                3, 32000, (int(torch.randint(8, 48, (1,), generator=gen)),), generator=gen
            ).tolist(),
        )
        for i in range(8)
    ]
    trainer.calibrate_kv(pack([p.token_ids for p in prompts], [[] for _ in prompts]))
    rows = []
    for step in range(args.steps):
        t = {"step": step}
        t0 = time.perf_counter()
        update, handle = trainer.publish()
        engine.apply_weights(update, handle)
        t["sync_s"] = time.perf_counter() - t0
        t["update_mb"] = (
            sum(
                int(torch.tensor(e.shape).prod())
                * (1 if e.dtype.startswith("float8") else 2 if "bf" in e.dtype else 4)
                for e in update.tensors
            )
            / 2**20
        )
        t0 = time.perf_counter()
        result = engine.generate(
            RolloutRequest(
                request_id=str(step),
                prompts=prompts,
                sampling=SamplingParams(n=4, max_tokens=args.max_tokens, seed=step),
            )
        )
        t["generate_s"] = time.perf_counter() - t0
        batch = pack(
            [s.prompt_token_ids for s in result.samples], [s.token_ids for s in result.samples]
        )
        rollout = torch.zeros(batch.response_ids.shape)
        for i, s in enumerate(result.samples):
            rollout[i, : len(s.logprobs)] = torch.tensor(s.logprobs)
        adv = torch.randn(len(result.samples))[:, None] * batch.response_mask
        tb = TrainBatch(
            packed=batch,
            rollout_logp=rollout,
            old_logp=rollout,
            advantages=adv,
            ref_logp=None,
            policy_version=result.policy_version,
            temperature=1.0,
        )
        t0 = time.perf_counter()
        tb.old_logp = trainer.logprobs(tb)
        t["score_s"] = time.perf_counter() - t0
        mask = batch.response_mask
        t["max_abs_dlogp"] = float(((tb.old_logp - rollout).abs() * mask).max())
        t["tokens"] = int(mask.sum())
        t0 = time.perf_counter()
        metrics = trainer.train(tb)
        t["train_s"] = time.perf_counter() - t0
        t["grad_norm"] = metrics["actor/grad_norm"]
        rows.append(t)
        print(json.dumps(t), flush=True)
    table = [
        "| step | tokens | max abs dlogp | update MiB | sync s | generate s | score s | train s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    table += [
        f"| {r['step']} | {r['tokens']} | {r['max_abs_dlogp']:.3g} | {r['update_mb']:.1f} | {r['sync_s']:.2f} | "
        f"{r['generate_s']:.2f} | {r['score_s']:.2f} | {r['train_s']:.2f} |"
        for r in rows
    ]
    print("\n".join(table))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_loop.md").write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
