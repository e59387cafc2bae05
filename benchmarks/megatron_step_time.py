"""Train-step time of the Megatron trainer vs the native trainer (same spec, same batches).

Usage: ``python benchmarks/megatron_step_time.py [cpu|cuda] [MODEL] [ROWS] [PROMPT] [RESPONSE]``
(defaults: ``tiny-llama``, 8 rows of 48 + 64 tokens; micro-batch = ROWS / 2). Prints one line
per exact mode: the median seconds per ``train()`` call of steps 2-4 for each backend.
"""

from __future__ import annotations

import sys
import time

import torch

from fp8rl.protocol import parse_job_spec
from fp8rl.workers.model.scoring import pack
from fp8rl.workers.ports import free_port
from fp8rl.workers.trainer.batch import TrainBatch
from fp8rl.workers.trainer.megatron.parallel import shutdown_parallel
from fp8rl.workers.trainer.megatron.trainer import MegatronTrainer
from fp8rl.workers.trainer.worker import TrainerWorker


def main(
    device: str = "cpu",
    model: str = "tiny-llama",
    rows: str = "8",
    prompt: str = "48",
    response: str = "64",
) -> None:
    """Time 4 steps per backend and exact mode on ``random:MODEL`` (ROWS × (PROMPT + RESPONSE))."""
    torch.set_num_threads(1)
    n, p, r = int(rows), int(prompt), int(response)
    for exact in ("false", "true"):
        common = [
            f"model.path=random:{model}",
            f"model.max_model_len={p + r}",
            "precision.mode=unified_fp8",
            f"precision.exact={exact}",
            f"trainer.micro_batch_size={max(n // 2, 1)}",
            "rollout.n=2",
            f"data.prompts_per_step={max(n // 2, 1)}",
            f"data.max_prompt_tokens={p}",
            f"rollout.max_tokens={r}",
        ]
        native_job = parse_job_spec("", common)
        job = parse_job_spec("", [*common, "trainer.backend=megatron"])
        kw = {"total_steps": 10, "batch_size": n, "device": device}
        trainers = {
            "native": TrainerWorker(
                native_job.model,
                native_job.trainer,
                native_job.algorithm,
                native_job.precision,
                **kw,
            ),
            "megatron": MegatronTrainer(
                job.model, job.trainer, job.algorithm, job.precision, port=free_port(), **kw
            ),
        }
        g = torch.Generator().manual_seed(0)
        vocab = trainers["megatron"].source.config.vocab_size
        packed = pack(
            [torch.randint(0, vocab, (p,), generator=g).tolist() for _ in range(n)],
            [torch.randint(0, vocab, (r,), generator=g).tolist() for _ in range(n)],
        )
        times: dict[str, list[float]] = {name: [] for name in trainers}
        for step in range(4):
            advantages = torch.randn(n, r, generator=g)
            batch = TrainBatch(packed, advantages * 0, advantages * 0, advantages, None, step, 1.0)
            for name, trainer in trainers.items():
                batch.old_logp = batch.rollout_logp = trainer.logprobs(batch)
                if device == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                trainer.train(batch)
                if device == "cuda":
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - start)
        medians = {name: round(sorted(t[1:])[1], 3) for name, t in times.items()}
        print(f"exact={exact} seconds/step {medians}")
        shutdown_parallel()


if __name__ == "__main__":
    main(*sys.argv[1:])
