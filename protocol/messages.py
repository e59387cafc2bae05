"""Messages between the driver and the workers: rollout requests/results and the quant handshake.

Token ids and per-token logprobs travel as plain lists (metadata-sized); weights never travel here
(see ``weights.py``: only their manifest does).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fp8rl.protocol.base import MessageModel
from fp8rl.protocol.quant import PrecisionMode, QuantConfig

FinishReason = Literal["stop", "length"]


class SamplingParams(MessageModel):
    """Per-request sampling settings (the rollout spec's defaults, or evaluation's)."""

    n: int = Field(default=1, ge=1)
    """Samples per prompt."""

    temperature: float = Field(default=1.0, ge=0)
    """0 means greedy (logprobs are then those of the T=1 softmax)."""

    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus mass (1.0 = off)."""

    top_k: int = Field(default=0, ge=0)
    """Top-k filter (0 = off)."""

    max_tokens: int = Field(default=64, ge=1)
    """Longest response in tokens."""

    stop_token_ids: list[int] = Field(default_factory=list)
    """Token ids that end a response (besides EOS)."""

    seed: int | None = None
    """Seed of the sampler; equal seeds and weights give equal samples."""


class Prompt(MessageModel):
    """One tokenized prompt."""

    prompt_id: str
    """Stable id (dataset row), used to group the n samples."""

    token_ids: list[int] = Field(min_length=1)
    """Prompt token ids, chat template already applied."""

    seed: int | None = Field(default=None, ge=0, lt=2**62)
    """Sampling stream of this prompt: sample j draws from ``sequence_seed(seed, j)``
    (``workers.rollout.sampling``). The driver derives it from the step's seed and the prompt's
    global index, so samples do not depend on which engine runs the prompt. None: derived from
    ``sampling.seed`` and the prompt's position in its request."""


class RolloutRequest(MessageModel):
    """Generate ``sampling.n`` responses for each prompt."""

    request_id: str
    """Id echoed in the result."""

    prompts: list[Prompt] = Field(min_length=1)
    """Prompts to complete."""

    sampling: SamplingParams
    """Sampling settings."""


class RolloutSample(MessageModel):
    """One generated response with what is needed to train on it."""

    prompt_id: str
    """The prompt it answers."""

    sample_index: int = Field(ge=0)
    """Index within the prompt's group of n."""

    prompt_token_ids: list[int]
    """The prompt, as given."""

    token_ids: list[int]
    """Generated token ids (the stop token included when generation stopped on one)."""

    logprobs: list[float]
    """log p(token) under the full-vocabulary softmax of logits/temperature, one per token."""

    finish_reason: FinishReason
    """``stop``: a stop token was sampled; ``length``: cut at max_tokens."""

    policy_version: int = Field(ge=0)
    """Weights version that generated it."""

    quant_fingerprint: str | None
    """QuantConfig fingerprint of the engine (None in bf16 mode)."""

    @model_validator(mode="after")
    def _one_logprob_per_token(self) -> RolloutSample:
        if len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"{len(self.logprobs)} logprobs for {len(self.token_ids)} tokens; need one per token"
            )
        return self


class RolloutResult(MessageModel):
    """All samples of a request plus engine metadata."""

    request_id: str
    """The request's id."""

    samples: list[RolloutSample]
    """n samples per prompt, grouped by prompt in request order."""

    policy_version: int = Field(ge=0)
    """Weights version the engine held for the whole request."""

    quant_fingerprint: str | None
    """The engine's QuantConfig fingerprint (None in bf16 mode)."""

    backend: str
    """Engine backend name (native, vllm, sglang)."""

    generation_s: float = Field(ge=0)
    """Wall time spent generating, in seconds."""


WorkerRole = Literal["rollout", "trainer", "reference", "critic", "reward"]


class Handshake(MessageModel):
    """What a worker reports at start so the driver can enforce the quant contract."""

    role: WorkerRole
    """Worker role."""

    rank: int = Field(default=0, ge=0)
    """Index among the workers of this role."""

    precision_mode: PrecisionMode
    """Precision mode the worker was built for."""

    fp8: bool
    """Whether this worker's forward runs FP8 GEMMs."""

    quant: QuantConfig | None
    """Its QuantConfig when ``fp8``, else None."""

    quant_fingerprint: str | None
    """``quant.fingerprint()``, or None."""

    kernel_backend: str
    """FP8/BF16 GEMM backend in use (``cpu-emulation``, ``triton``, ``scaled_mm``, ``torch``)."""

    exact: bool
    """Whether batch-invariant (bitwise parity) kernels are on."""

    device: str
    """Device the worker computes on (``cpu``, ``cuda:0``)."""

    backend: str = "native"
    """Engine or trainer backend name."""
