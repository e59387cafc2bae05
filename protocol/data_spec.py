"""Where prompts come from: the built-in arithmetic task or a dataset file/directory."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fp8rl.protocol.base import StrictModel, tagged_union


class ArithmeticDataset(StrictModel):
    """Procedurally generated arithmetic problems with exact integer answers (no download)."""

    type: Literal["arithmetic"] = "arithmetic"
    """Discriminator: the built-in arithmetic task."""

    difficulty: int = Field(default=1, ge=1, le=5)
    """1: a+b with one-digit numbers … 5: three operations on three-digit numbers."""

    num_problems: int = Field(default=1024, ge=1)
    """How many distinct problems the generator yields (then it repeats, reshuffled)."""

    seed: int = Field(default=1234, ge=0, lt=2**62)
    """Seed of the problem generator (independent of the run seed, so splits are stable)."""


class FileDataset(StrictModel):
    """Rows from a ``.jsonl``/``.parquet`` file, a saved Hugging Face dataset directory, or a hub name."""

    type: Literal["file"] = "file"
    """Discriminator: a dataset on disk (or a hub name when ``hub=true``)."""

    path: str
    """A ``.jsonl`` or ``.parquet`` file, a ``datasets.save_to_disk`` directory, or a hub name."""

    hub: bool = False
    """Treat ``path`` as a Hugging Face hub dataset name (needs network access)."""

    split: str = "train"
    """Split to read for directories and hub datasets."""

    prompt_key: str = "question"
    """Row field holding the problem text."""

    answer_key: str = "answer"
    """Row field holding the reference answer (given to the reward function)."""

    limit: int | None = Field(default=None, ge=1)
    """Use only the first ``limit`` rows (before shuffling)."""


DatasetSpec = tagged_union("type", "arithmetic", ArithmeticDataset, FileDataset)


class DataSpec(StrictModel):
    """Training prompts: source, formatting and batching."""

    train: DatasetSpec = Field(default_factory=ArithmeticDataset)
    """The training prompt source."""

    prompts_per_step: int = Field(default=4, ge=1)
    """Distinct prompts sampled per RL step (each gets ``rollout.n`` responses)."""

    prompt_template: str = "{question}"
    """Python format string applied to each row; ``{question}`` is the prompt field."""

    system_prompt: str | None = None
    """System message put before the prompt when the chat template is used."""

    shuffle: bool = True
    """Shuffle rows each epoch, deterministically from the run seed."""

    max_prompt_tokens: int = Field(default=512, ge=1)
    """Prompts longer than this (after templating) are skipped with a warning."""
