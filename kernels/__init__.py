"""fp8rl.kernels: FP8 quantizers, blockwise FP8 GEMM and FP8Linear (DESIGN.md §2).

Importable without Triton or CUDA (CPU CI): the Triton kernels live in ``quant_triton``,
``gemm_triton``, ``gemm_decode_triton`` (decode-size GEMM), ``fused_triton`` (norm/SwiGLU +
quant, public wrappers in ``fused``) and ``decode_attention_triton`` (split-KV attention over the
KV cache, public wrapper in ``decode_attention``) and ``rope_kv_triton`` (RoPE + KV-cache write of
an inference step, public wrapper in ``rope_kv``) and are imported only when a CUDA tensor
reaches a public wrapper.
"""

from fp8rl.kernels.backend import kernel_backend
from fp8rl.kernels.finite import deferred_finite_checks
from fp8rl.kernels.gemm import fp8_gemm, fp8_gemm_reference, scaled_mm_scales
from fp8rl.kernels.linear import FP8Linear, FP8LinearFunction, fp8_linear
from fp8rl.kernels.linear_group import grouped_fp8_linear
from fp8rl.kernels.quant import (
    FP8_DTYPE,
    FP8_E4M3_MAX,
    GROUP,
    MIN_SCALE,
    QuantizedTensor,
    per_block_quant,
    per_block_quant_reference,
    per_column_group_quant,
    per_column_group_quant_reference,
    per_token_and_column_group_quant,
    per_token_group_quant,
    per_token_group_quant_reference,
    requant_to_column_groups,
    requant_to_column_groups_reference,
    round_up_pow2,
    scale_from_amax,
    scale_grid_shape,
)

__all__ = [
    "FP8_DTYPE",
    "FP8_E4M3_MAX",
    "GROUP",
    "MIN_SCALE",
    "FP8Linear",
    "FP8LinearFunction",
    "QuantizedTensor",
    "deferred_finite_checks",
    "fp8_gemm",
    "fp8_gemm_reference",
    "fp8_linear",
    "grouped_fp8_linear",
    "kernel_backend",
    "per_block_quant",
    "per_block_quant_reference",
    "per_column_group_quant",
    "per_column_group_quant_reference",
    "per_token_and_column_group_quant",
    "per_token_group_quant",
    "per_token_group_quant_reference",
    "requant_to_column_groups",
    "requant_to_column_groups_reference",
    "round_up_pow2",
    "scale_from_amax",
    "scale_grid_shape",
    "scaled_mm_scales",
]
