"""The weight-update manifest. Tensor bytes move out of band (object store, CUDA IPC, NCCL).

A ``WeightUpdate`` lists every tensor the receiver must write, with what it needs to check the
update completely *before* writing anything (DESIGN.md §4): names, shapes, dtypes, block size,
scale format and a checksum per tensor, plus the policy version and the quant fingerprint.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fp8rl.protocol.base import MessageModel

TensorRole = Literal["fp8_weight", "weight_scale", "dense", "kv_scale"]


class TensorEntry(MessageModel):
    """One tensor of a weight update."""

    name: str
    """Parameter name in the shared decoder (``model.layers.0.mlp.down_proj.weight``)."""

    role: TensorRole
    """``fp8_weight``: E4M3 codes; ``weight_scale``: its 128×128 block scales (dequantization
    multipliers, ``weight_scale_inv`` in HF naming); ``dense``: a BF16/FP32 tensor; ``kv_scale``."""

    shape: list[int]
    """Logical shape."""

    dtype: str
    """torch dtype name without the ``torch.`` prefix (``float8_e4m3fn``, ``float32``, ``bfloat16``)."""

    block_size: list[int] | None = None
    """For FP8 weights and their scales: the scale block (``[128, 128]``)."""

    scale_format: Literal["fp32", "pow2"] | None = None
    """For FP8 weights and their scales: the scale rule."""

    checksum: str
    """``wsum64`` checksum of the tensor's bytes (``fp8rl.workers.weight_sync.checksum``)."""


class WeightUpdate(MessageModel):
    """A complete set of policy weights at one version."""

    version: int = Field(ge=0)
    """Policy version = optimizer steps taken (0: the initial weights); must increase with every
    applied update (an engine that has applied none accepts any version)."""

    quant_fingerprint: str | None
    """QuantConfig fingerprint the FP8 codes were made with (None for all-dense updates)."""

    transport: Literal["object_store", "cuda_ipc", "nccl", "local"]
    """How the payload travels (``local``: inside one process, ``resources.hybrid_engine``)."""

    tensors: list[TensorEntry] = Field(min_length=1)
    """Every tensor of the update; the receiver refuses missing or extra names."""

    @model_validator(mode="after")
    def _unique_names(self) -> WeightUpdate:
        names = [t.name for t in self.tensors]
        if len(names) != len(set(names)):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate tensor names: {dup}")
        return self
