"""Per-GPU memory estimate of each actor of a job, from the model's shape and the job's settings.

The estimate is an upper bound written for ``fp8rl validate --plan``: it answers "can this spec
fit the cluster it declares", before anything starts. Its terms, per actor and per GPU:

trainer (FSDP2 over ``trainer.num_workers`` ranks, ZeRO-3 style as in TorchTitan):
    master weights (``trainer.master_dtype``), fp32 gradients and AdamW's two moments (in the
    master dtype), each sharded ``1/num_workers``; ``trainer.offload`` moves AdamW state
    (``optimizer``) or all three (``params_and_optimizer``) to the host. Plus the unsharded BF16
    compute copy FSDP gathers (two decoder blocks, for prefetch, and the embeddings/lm_head);
    activations of one micro-batch of ``micro_batch_size × max_model_len`` tokens (with
    ``gradient_checkpointing``: one block input per layer plus one block recomputed; without:
    every layer's); and the logprob tail over one chunk of ``LOGPROB_CHUNK_TOKENS`` tokens at
    ``LOGPROB_BYTES_PER_LOGIT`` bytes per (token × vocab), as measured for the unchunked tail.
reference: its weights (FP8 linear codes when the trainer runs FP8 GEMMs, else the model dtype)
    replicated on each reference actor, and a forward-only logprob chunk.
critic: the trainer's terms without the vocabulary-sized logprob tail.
rollout engine: vLLM and SGLang take their configured fraction of the GPU
    (``gpu_memory_utilization``/``mem_fraction_static``: weights and KV cache inside it); the
    native engine holds its weights and a KV cache for ``max_batch_size`` sequences of
    ``max_model_len`` tokens.
every actor: ``RUNTIME_GIB`` for the CUDA context, NCCL buffers and the allocator's slack.

Colocated actors are summed: the estimate does not assume that engines release their memory
while the trainer runs. Numbers are bytes (``float``); ``GIB`` converts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fp8rl.protocol import JobSpec

if TYPE_CHECKING:  # the model package imports torch; `fp8rl validate` stays light without it
    from fp8rl.workers.model.config import DecoderConfig

GIB = 1024**3
LOGPROB_CHUNK_TOKENS = 2048
"""Tokens per chunk of the lm_head + log-softmax tail (the trainer's chunked logprob)."""
LOGPROB_BYTES_PER_LOGIT = 31
"""Bytes per (token × vocab) of the training logprob/entropy tail (logits, softmax, grads)."""
FORWARD_BYTES_PER_LOGIT = 10
"""Bytes per (token × vocab) of a forward-only logprob (bf16 logits, fp32 copy, log-softmax)."""
RUNTIME_GIB = 1.0
"""CUDA context, NCCL buffers and allocator slack of one actor on a GPU."""

SMOLLM2_135M = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "tie_word_embeddings": True,
}
"""DecoderConfig fields of ``builtin:smollm2-135m-instruct`` (known without converting the GGUF)."""


@dataclass(frozen=True)
class ActorMemory:
    """Estimated bytes one actor holds on one of its GPUs, by term (``weights``, ``kv_cache``...)."""

    role: str
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        """Sum of the terms, in bytes."""
        return sum(self.parts.values())


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of a decoder (elements, not bytes)."""

    linear: int  # q/k/v/o and MLP projection weights of every layer (the FP8 GEMMs)
    embedding: int  # token embedding plus an untied lm_head
    other: int  # norms and biases
    block: int  # parameters of one decoder block

    @property
    def total(self) -> int:
        """All parameters."""
        return self.linear + self.embedding + self.other


def param_counts(cfg: DecoderConfig) -> ParamCounts:
    """Parameters of ``cfg`` (Llama/Qwen layout: GQA attention, SwiGLU MLP, RMSNorm)."""
    h, q, kv = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads
    kv_dim = kv * cfg.head_dim
    attn = h * q + 2 * h * kv_dim + q * h
    mlp = 3 * h * cfg.intermediate_size
    bias = (q + 2 * kv_dim) if cfg.attention_bias else 0
    norms = 2 * h + (2 * cfg.head_dim if cfg.qk_norm else 0)
    layers = cfg.num_hidden_layers
    embedding = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    return ParamCounts(
        linear=layers * (attn + mlp),
        embedding=embedding,
        other=layers * (bias + norms) + h,
        block=attn + mlp + bias + norms,
    )


def model_shape(path: str, *, read_config: bool = True) -> DecoderConfig | None:
    """The architecture ``model.path`` names, without loading weights, or None when unknown.

    Order: ``random:PRESET``; ``builtin:smollm2-135m-instruct``; a readable ``config.json`` (a
    Hugging Face directory on this machine, when ``read_config``); else a preset whose name the path's last component
    contains (``/data/models/Llama-3.1-8B-Instruct`` → ``llama-3.1-8b``), so a spec for a cluster
    can be planned where its files are not.
    """
    from fp8rl.workers.model.config import PRESETS, DecoderConfig, config_from_hf

    kind, _, name = path.partition(":")
    if kind == "random":
        return PRESETS.get(name)
    if kind == "builtin":
        return DecoderConfig(**SMOLLM2_135M)
    config = Path(path).expanduser() / "config.json"
    if read_config and config.is_file():
        try:
            return config_from_hf(json.loads(config.read_text()))
        except (OSError, ValueError):
            return None
    return preset_for_name(Path(path).name)


def preset_for_name(name: str) -> DecoderConfig | None:
    """The full-size preset whose name ``name`` contains, ignoring case and ``-``/``.``/``_``."""
    from fp8rl.workers.model.config import PRESETS

    squeeze = re.sub(r"[-._]", "", name.lower())
    for preset, cfg in PRESETS.items():
        if not preset.startswith(("tiny", "small")) and re.sub(r"[-._]", "", preset) in squeeze:
            return cfg
    return None


def _dtype_bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def activation_bytes_per_token_layer(cfg: DecoderConfig, dtype: str) -> float:
    """Activations one decoder block keeps for backward, per token (bytes): norm inputs and
    outputs, q/k/v, attention output, the MLP's gate, up, activation and down input."""
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    return _dtype_bytes(dtype) * (6 * cfg.hidden_size + 2 * q + 4 * kv + 4 * cfg.intermediate_size)


def trainer_memory(job: JobSpec, cfg: DecoderConfig, *, value_head: bool = False) -> ActorMemory:
    """Bytes one trainer rank (or, with ``value_head``, one critic rank) holds on its GPU."""
    t, counts = job.trainer, param_counts(cfg)
    world, n = t.num_workers, counts.total
    master = _dtype_bytes(t.master_dtype)
    parts: dict[str, float] = {}
    on_gpu_params = t.offload != "params_and_optimizer"
    parts["master_weights"] = n * master / world if on_gpu_params else 0.0
    parts["gradients"] = n * 4 / world if on_gpu_params else 0.0
    parts["optimizer"] = 2 * n * master / world if t.offload == "none" else 0.0
    compute = _dtype_bytes(job.model.dtype)
    parts["gathered_weights"] = (2 * counts.block + counts.embedding) * compute
    tokens = t.micro_batch_size * job.model.max_model_len
    per_layer = tokens * activation_bytes_per_token_layer(cfg, job.model.dtype)
    if t.gradient_checkpointing:
        stash = tokens * cfg.hidden_size * compute * cfg.num_hidden_layers
        parts["activations"] = stash + per_layer
    else:
        parts["activations"] = per_layer * cfg.num_hidden_layers
    if not value_head:
        chunk = min(tokens, LOGPROB_CHUNK_TOKENS)
        parts["logprob_chunk"] = chunk * cfg.vocab_size * LOGPROB_BYTES_PER_LOGIT
    parts["runtime"] = RUNTIME_GIB * GIB
    return ActorMemory("critic" if value_head else "trainer", parts)


def reference_memory(job: JobSpec, cfg: DecoderConfig) -> ActorMemory:
    """Bytes one reference actor holds: its full weights and a forward-only logprob chunk."""
    counts = param_counts(cfg)
    compute = _dtype_bytes(job.model.dtype)
    linear = 1 if job.precision.trainer_fp8 else compute
    tokens = min(job.trainer.micro_batch_size * job.model.max_model_len, LOGPROB_CHUNK_TOKENS)
    return ActorMemory(
        "reference",
        {
            "weights": counts.linear * linear + (counts.embedding + counts.other) * compute,
            "logprob_chunk": tokens * cfg.vocab_size * FORWARD_BYTES_PER_LOGIT,
            "runtime": RUNTIME_GIB * GIB,
        },
    )


def engine_memory(job: JobSpec, cfg: DecoderConfig) -> ActorMemory:
    """Bytes one rollout engine holds on each of its GPUs."""
    r, gpu = job.rollout, job.resources.gpu_memory_gib * GIB
    runtime = RUNTIME_GIB * GIB
    if r.backend == "vllm":
        parts = {"engine_pool": r.gpu_memory_utilization * gpu}
        return ActorMemory("rollout", {**parts, "runtime": runtime})
    if r.backend == "sglang":
        return ActorMemory(
            "rollout", {"engine_pool": r.mem_fraction_static * gpu, "runtime": runtime}
        )
    counts = param_counts(cfg)
    compute = _dtype_bytes(job.model.dtype)
    linear = 1 if job.precision.rollout_fp8 else compute
    kv_bytes = 1 if job.precision.quant.kv_cache_dtype == "fp8_e4m3" else compute
    rows = r.max_batch_size
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * kv_bytes
    return ActorMemory(
        "rollout",
        {
            "weights": counts.linear * linear + (counts.embedding + counts.other) * compute,
            "kv_cache": rows * job.model.max_model_len * per_token,
            "logits": rows * cfg.vocab_size * 4 * 3,
            "runtime": runtime,
        },
    )


def role_memory(job: JobSpec, cfg: DecoderConfig, role: str) -> ActorMemory:
    """The estimate for one actor of ``role`` (trainer, critic, reference or rollout)."""
    if role == "trainer":
        return trainer_memory(job, cfg)
    if role == "critic":
        return trainer_memory(job, cfg, value_head=True)
    if role == "reference":
        return reference_memory(job, cfg)
    if role == "rollout":
        return engine_memory(job, cfg)
    raise ValueError(f"no memory estimate for role {role!r}")
