"""Rollout engine settings; the backend is a discriminated union on ``backend``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fp8rl.protocol.base import StrictModel, tagged_union


class _RolloutCommon(StrictModel):
    n: int = Field(default=4, ge=1)
    """Responses sampled per prompt (the GRPO group size)."""

    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature. Logprobs are of the full-vocabulary softmax of logits/temperature."""

    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass (1.0 = off)."""

    top_k: int = Field(default=0, ge=0)
    """Keep the k most likely tokens (0 = off)."""

    max_tokens: int = Field(default=64, ge=1)
    """Longest response, in tokens; a response cut here finishes with reason ``length``."""

    stop_token_ids: list[int] = Field(default_factory=list)
    """Extra token ids that end a response (the tokenizer's EOS always does)."""

    seed: int | None = None
    """Sampling seed (None: derived from the run seed and the step)."""

    num_workers: int = Field(default=1, ge=1)
    """Rollout actors (engines); prompts are split among them."""

    gpus_per_worker: int = Field(default=0, ge=0)
    """GPUs each rollout actor holds (0 on CPU)."""


class NativeRollout(_RolloutCommon):
    """fp8rl's own engine: the trainer's decoder with a KV cache (bit-identical numerics)."""

    backend: Literal["native"] = "native"
    """Discriminator: fp8rl's native engine."""

    max_batch_size: int = Field(default=256, ge=1)
    """Most sequences decoded together."""

    cuda_graphs: bool = True
    """Capture decode steps in CUDA graphs (GPU only; ignored on CPU)."""


class VLLMRollout(_RolloutCommon):
    """vLLM's offline engine with fp8rl's quantization method plugged in."""

    backend: Literal["vllm"] = "vllm"
    """Discriminator: vLLM."""

    tensor_parallel_size: int = Field(default=1, ge=1)
    """vLLM tensor-parallel size per engine."""

    gpu_memory_utilization: float = Field(default=0.3, gt=0, le=1)
    """Fraction of device memory vLLM may take (KV cache included); ~0.3 on CPU."""

    enforce_eager: bool = False
    """Disable CUDA graphs in vLLM."""


class SGLangRollout(_RolloutCommon):
    """SGLang's engine (planned; refused at start until implemented)."""

    backend: Literal["sglang"] = "sglang"
    """Discriminator: SGLang."""

    tensor_parallel_size: int = Field(default=1, ge=1)
    """SGLang tensor-parallel size per engine."""

    mem_fraction_static: float = Field(default=0.5, gt=0, le=1)
    """Fraction of device memory for weights + KV cache."""


RolloutSpec = tagged_union("backend", "native", NativeRollout, VLLMRollout, SGLangRollout)
