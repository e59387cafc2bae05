"""One sharded-trainer step at 8B shapes: peak device memory and step time, bf16 vs unified_fp8.

    python benchmarks/train_8b.py --out DIR [--preset llama-3.1-8b] [--tokens 8192]

Each mode runs in its own process: a ``TrainerWorker`` rank of an FSDP2 group of world size 1
(NCCL on GPU, gloo on CPU), random weights, fp32 master weights, AdamW with host-resident state
(``trainer.offload=optimizer``), gradient checkpointing, one micro-batch of ``--tokens`` tokens
(a ``--prompt``-token prompt, the rest response). It scores the batch (old logprobs), then runs
``--steps`` optimizer steps and reports the last one. A CPU run with ``--preset tiny-llama``
checks the script.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

MODES = ("bf16", "unified_fp8")


def job(preset: str, mode: str, tokens: int, prompt: int, offload: str, device: str):
    from fp8rl.protocol import parse_job_spec

    return parse_job_spec(
        "",
        [
            f"model.path=random:{preset}",
            f"model.max_model_len={tokens}",
            f"data.max_prompt_tokens={prompt}",
            f"rollout.max_tokens={tokens - prompt}",
            "data.prompts_per_step=1",
            "rollout.n=2",
            "trainer.micro_batch_size=1",
            "trainer.master_dtype=float32",
            "trainer.gradient_checkpointing=true",
            f"trainer.offload={offload}",
            "trainer.lr=1e-6",
            f"precision.mode={mode}",
            f"resources.device={device}",
        ],
    )


def batch(vocab: int, tokens: int, prompt: int):
    from fp8rl.workers.model.scoring import pack
    from fp8rl.workers.trainer.batch import TrainBatch

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (tokens,), generator=gen).tolist()
    packed = pack([ids[:prompt]], [ids[prompt:]])
    shape = packed.response_ids.shape
    return TrainBatch(
        packed=packed,
        rollout_logp=torch.zeros(shape),
        old_logp=None,
        advantages=torch.randn(shape, generator=gen),
        ref_logp=None,
        policy_version=0,
        temperature=1.0,
    )


def one_mode(args: argparse.Namespace) -> dict:
    from fp8rl.workers.ports import free_port
    from fp8rl.workers.trainer.worker import TrainerWorker

    cuda = torch.cuda.is_available()
    spec = job(args.preset, args.mode, args.tokens, args.prompt, args.offload, args.device)
    init = f"tcp://127.0.0.1:{free_port()}"
    t0 = time.perf_counter()
    trainer = TrainerWorker(
        spec.model,
        spec.trainer,
        spec.algorithm,
        spec.precision,
        total_steps=args.steps,
        batch_size=1,
        device=args.device,
        seed=0,
        rank=0,
        world_size=1,
        init_method=init,
    )
    build_s = time.perf_counter() - t0
    data = batch(trainer.model.config.vocab_size, args.tokens, args.prompt)
    gib = {"after_build": _allocated()}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    data.old_logp = trainer.logprobs(data)
    logprob_s = time.perf_counter() - t0
    gib["logprob_peak"] = _peak()
    steps = []
    for step in range(args.steps):
        data.policy_version = step
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        metrics = trainer.train(data)
        if cuda:
            torch.cuda.synchronize()
        steps.append(time.perf_counter() - t0)
        gib[f"train{step}_peak"] = _peak()
        gib[f"after_train{step}"] = _allocated()
    return {
        "mode": args.mode,
        "preset": args.preset,
        "tokens": args.tokens,
        "offload": args.offload,
        "build_s": round(build_s, 1),
        "logprob_s": round(logprob_s, 2),
        "step_s": [round(s, 2) for s in steps],
        "peak_gib": max(v for k, v in gib.items() if k.endswith("peak")) if cuda else None,
        "phases_gib": gib if cuda else None,
        "reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 1) if cuda else None,
        "grad_norm": metrics["actor/grad_norm"],
        "pg_loss": metrics["actor/pg_loss"],
    }


def _allocated() -> float | None:
    """GiB allocated on the current CUDA device now (None on CPU)."""
    return round(torch.cuda.memory_allocated() / 2**30, 1) if torch.cuda.is_available() else None


def _peak() -> float | None:
    """GiB peak allocated since the last reset (None on CPU)."""
    if not torch.cuda.is_available():
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="llama-3.1-8b")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--offload", default="optimizer")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--mode", choices=MODES, help="run one mode in this process")
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(one_mode(args)), flush=True)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in MODES:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--mode", mode]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            rows.append({"mode": mode, "error": done.stderr[-3000:]})
        else:
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    info = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "rows": rows,
    }
    (args.out / "train-8b.json").write_text(json.dumps(info, indent=2))
    print("| mode | peak GiB | reserved GiB | step s | logprob s |")
    for r in rows:
        if "error" not in r:
            print(
                f"| {r['mode']} | {r['peak_gib']} | {r['reserved_gib']} | {r['step_s'][-1]} | "
                f"{r['logprob_s']} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
