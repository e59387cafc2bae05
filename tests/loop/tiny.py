"""Job specs for small trainer + engine pairs on the tiny random Llama (seconds on CPU)."""

from __future__ import annotations

from fp8rl.protocol import parse_job_spec


def tiny_job(*overrides: str):
    """The quickstart spec on random:tiny-llama with a CPU-sized batch."""
    base = [
        "model.path=random:tiny-llama",
        "model.max_model_len=128",
        "data.max_prompt_tokens=64",
        "rollout.max_tokens=8",
        "data.prompts_per_step=2",
        "rollout.n=2",
        "steps=2",
        "trainer.micro_batch_size=2",
        "trainer.lr=1e-3",
    ]
    return parse_job_spec("", [*base, *overrides])
