"""Prompt data: the built-in arithmetic task and dataset files, deterministic batches, rendering.

``build_dataset(spec)`` turns a ``DatasetSpec`` into ``PromptRecord``s; ``PromptSampler`` draws
seeded batches whose cursor goes into checkpoints; ``render_prompt`` applies the prompt and chat
templates and returns token ids.
"""

from fp8rl.protocol.data_spec import ArithmeticDataset, FileDataset
from fp8rl.services.data.arithmetic import evaluate_expression, generate_arithmetic
from fp8rl.services.data.files import file_dataset_name, load_file_dataset
from fp8rl.services.data.records import PromptRecord
from fp8rl.services.data.render import format_prompt, render_prompt
from fp8rl.services.data.sampler import PromptSampler


def build_dataset(spec: ArithmeticDataset | FileDataset) -> list[PromptRecord]:
    """All records of ``spec`` in source order (``limit`` applied for files).

    Raises ``ValueError`` for a missing/unknown file or a field the spec names but rows lack.
    """
    if isinstance(spec, ArithmeticDataset):
        return generate_arithmetic(spec)
    return load_file_dataset(spec)


def dataset_name(spec: ArithmeticDataset | FileDataset) -> str:
    """Short name for metric keys (``val/<name>/acc``): ``arithmetic_L2``, ``gsm8k_test``, ..."""
    if isinstance(spec, ArithmeticDataset):
        return f"arithmetic_L{spec.difficulty}"
    return file_dataset_name(spec)


__all__ = [
    "PromptRecord",
    "PromptSampler",
    "build_dataset",
    "dataset_name",
    "evaluate_expression",
    "file_dataset_name",
    "format_prompt",
    "generate_arithmetic",
    "load_file_dataset",
    "render_prompt",
]
