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

    seed: int | None = Field(default=None, ge=0, lt=2**62)
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

    enable_sleep_mode: bool = False
    """Start vLLM with its sleep mode (CUDA only), so ``release_memory``/``resume_memory``
    (``LLM.sleep(level=1)``/``wake_up``) move the weights to host memory and drop the KV cache
    while colocated trainer ranks train on the same GPU. Not run on a GPU by fp8rl's tests."""


class SGLangRollout(_RolloutCommon):
    """SGLang's offline ``Engine`` (block-FP8 ``quantization: fp8``, SGLang's own kernels).

    Tested against the SGLang 0.5.23 API contract and a fake engine only (docs/sglang.md).
    """

    backend: Literal["sglang"] = "sglang"
    """Discriminator: SGLang."""

    tensor_parallel_size: int = Field(default=1, ge=1)
    """SGLang tensor-parallel size per engine (``tp_size``)."""

    mem_fraction_static: float = Field(default=0.5, gt=0, le=1)
    """Fraction of device memory for weights + KV cache."""

    enable_memory_saver: bool = False
    """Start SGLang with its memory saver, so ``release_memory``/``resume_memory`` free and
    restore weights, KV cache and CUDA graphs around training on a shared GPU (colocated)."""

    weight_bucket_mb: int = Field(default=512, ge=1)
    """Largest ``update_weights_from_tensor`` call of a weight update, in MiB (tensors are
    grouped into buckets up to this size; a larger single tensor goes alone)."""


RolloutSpec = tagged_union("backend", "native", NativeRollout, VLLMRollout, SGLangRollout)
