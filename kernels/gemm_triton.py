"""Triton blockwise-scaled FP8 GEMM ``a · bᵀ`` (GPU only; the ``exact`` and fallback backend).

Design notes
------------
* One program owns one ``BLOCK_M × BLOCK_N`` output tile and walks K in 128-wide steps: one fp8
  ``tl.dot`` per K block into a *fresh* float32 partial, scaled by ``sa[row, kb] · sb[col, kb]``
  and added to the float32 accumulator on the CUDA cores. That is DeepGEMM's "promotion" every
  128 K (Hopper's FP8 tensor-core accumulation keeps ~14 bits, DeepSeek-V3 §3.3.2) and it makes
  the scale granularity exact: the K tile *is* the scale group.
* No split-K, no atomics, no autotuning: a row's output depends only on that row, the tile
  config and K. ``exact=True`` pins one config (``EXACT_CONFIG``) for every M, so a row's bits do
  not depend on the batch size (M is also excluded from Triton's integer specialisation). The
  fast path picks a config from (M, N) (``config_for``): deterministic, not batch-invariant.
* Scale addressing is generic: ``row // ROW_DIV`` selects the scale row, so (1,128) and (128,128)
  operands use the same kernel (FProp 1×128 · 128×128, DGrad 1×128 · (128×128)ᵀ, WGrad
  1×128 · 1×128). Both operands must be K-contiguous (the wrapper copies otherwise), which is the
  K-major layout Hopper's fp8 wgmma needs.
* Rows beyond M / columns beyond N / K beyond the last partial block are masked loads (zeros)
  and masked stores: padded storage is never read into, nor written from, real outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from fp8rl.kernels.gemm import k_major
from fp8rl.kernels.quant import GROUP, QuantizedTensor


@dataclass(frozen=True)
class TileConfig:
    """Tile shape and launch parameters of one compiled variant of the GEMM kernel."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    group_m: int = 8


EXACT_CONFIG = TileConfig(block_m=64, block_n=128, num_warps=4, num_stages=4)
"""The single config of the batch-invariant mode (used for every M); also the fastest 64-row
tile at M ≥ 4096 in the H200 sweep (810 TFLOP/s at 4096³ vs 646 for 128×128 with 8 warps)."""

_NUM_SMS = 132  # H200 / H100 SXM; only steers the fast-path tile width


def config_for(m: int, n: int) -> TileConfig:
    """Fast-path config: 64×128 tiles when they fill the GPU, else 64×64 for more programs.

    From the H200 sweep (benchmarks/results/kernels-h200.md): 64-row tiles with 4 warps beat
    128×128/8 warps at every M measured; narrow 64×64 tiles win while 64×128 tiles would leave
    SMs idle (M ≤ 256 with N ≈ 4096).
    """
    wide_tiles = triton.cdiv(m, 64) * triton.cdiv(n, 128)
    block_n = 128 if wide_tiles >= _NUM_SMS else 64
    return TileConfig(block_m=64, block_n=block_n, num_warps=4, num_stages=4)


@triton.jit(do_not_specialize=["M"])
def _blockwise_fp8_gemm_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K,
    stride_am, stride_bn, stride_cm, stride_cn,
    stride_sam, stride_sak, stride_sbn, stride_sbk,
    A_ROW_DIV: tl.constexpr, B_ROW_DIV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    BLOCK_K: tl.constexpr = 128
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_n  # grouped tile order for L2 reuse; does not change any tile's math
    first_m = (pid // width) * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % group_size
    pid_n = (pid % width) // group_size

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_n.to(tl.int64)[None, :] * stride_bn + offs_k[:, None]
    sa_ptrs = sa_ptr + (offs_m // A_ROW_DIV) * stride_sam
    sb_ptrs = sb_ptr + (offs_n // B_ROW_DIV) * stride_sbn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kb = k0 // BLOCK_K
        k_mask = offs_k < K - k0
        a = tl.load(a_ptrs, mask=mask_m[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & mask_n[None, :], other=0.0)
        sa = tl.load(sa_ptrs + kb * stride_sak, mask=mask_m, other=0.0)
        if B_ROW_DIV >= BLOCK_N:  # the tile lies in one 128-row weight block: a scalar scale
            sb = tl.load(sb_ptr + (pid_n * BLOCK_N // B_ROW_DIV) * stride_sbn + kb * stride_sbk)
            acc += tl.dot(a, b) * (sa * sb)[:, None]
        else:
            sb = tl.load(sb_ptrs + kb * stride_sbk, mask=mask_n, other=0.0)
            acc += (tl.dot(a, b) * sa[:, None]) * sb[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def fp8_gemm_triton(
    a: QuantizedTensor,
    b: QuantizedTensor,
    *,
    out_dtype: torch.dtype,
    exact: bool = False,
    config: TileConfig | None = None,
) -> Tensor:
    """Triton ``a [M, K] · b [N, K]ᵀ`` → ``[M, N]`` in ``out_dtype`` (2-D operands, groups along K).

    ``config`` overrides the tile choice (benchmarks only); ``exact`` pins ``EXACT_CONFIG``.
    """
    assert a.codes.dim() == 2 and b.codes.dim() == 2 and a.block[1] == b.block[1] == GROUP
    codes_a = a.codes if a.codes.stride(-1) == 1 else k_major(a.codes)
    codes_b = b.codes if b.codes.stride(-1) == 1 else k_major(b.codes)
    m, k = codes_a.shape
    n = codes_b.shape[0]
    out = torch.empty(m, n, dtype=out_dtype, device=codes_a.device)
    if m == 0 or n == 0:
        return out
    cfg = EXACT_CONFIG if exact else (config or config_for(m, n))
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    sa, sb = a.scale, b.scale
    _blockwise_fp8_gemm_kernel[grid](
        codes_a, codes_b, out, sa, sb, m, n, k,
        codes_a.stride(0), codes_b.stride(0), out.stride(0), out.stride(1),
        sa.stride(0), sa.stride(1), sb.stride(0), sb.stride(1),
        A_ROW_DIV=a.block[0], B_ROW_DIV=b.block[0],
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out
