"""Decode attention over the KV cache (issue 14, deliverable 3): split-KV on CUDA, torch elsewhere.

A decode step has one (or a few) query positions per sequence and reads the whole cache, so it
is a memory stream, not a matrix product: the fast path used to dequantize the entire FP8
cache every step, build a ``[B, 1, Lq, capacity]`` mask and run cuDNN SDPA over all
``kv_limit`` positions. ``decode_attention`` instead runs the flash-decoding kernels of
``decode_attention_triton`` (Dao et al. 2023, "Flash-Decoding for long-context inference"):

* the cache is read in place, BF16 or FP8 E4M3 (per-tensor ``k_scale``/``v_scale``, dequantized
  in registers bitwise like ``kv.kv_dequantize``), and only up to each sequence's ``k_len``;
* ``k_len``/``positions`` stay on the device and the split count depends only on
  ``(batch, kv heads, capacity)``, so one captured CUDA graph serves every length below its
  ``kv_limit`` bucket;
* the query heads of one KV head are the rows of one ``tl.dot`` (GQA), and the splits are
  merged in a fixed order (deterministic, but **not** batch-invariant and not bitwise the
  invariant attention:
  ``precision.exact`` never runs it, and in fast mode the engine's logprobs round differently
  from the trainer's forward).

``decode_attention_reference`` is the float64 truth (CPU tests, GPU tests) and the CPU path.
``set_enabled`` switches the decoder's dispatch (``use_decode_attention``) process-wide.

**Off by default: it breaks fast-mode parity** (H200, 2026-12-02,
``benchmarks/results/issue14/decode-attention-h200.md``). Its split-KV merge rounds differently
from the trainer's attention: the fast-mode token_mult_prob_error went from 1.00000000 to
1.00255701 (tiny-llama) and 1.02872759 (small-llama), over the issue's "no worse than before"
bounds of ``tests/gpu/test_parity_gpu.py``. Since 2026-12-04 the fast mode's default attention
is the invariant kernel (``attention_exact_triton``), which also reads the cache in place and is
bitwise the trainer's; this kernel is 1.1-1.3× faster than that at batch 64-256 on a BF16 cache
and up to 1.3× on an FP8 one (``benchmarks/decode_attention.py``). ``set_enabled(True)`` (or
``benchmarks/rollout.py --decode-attn on``) trades the mismatch for that speed.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fp8rl.kernels.kv import kv_dequantize

MAX_ROWS = 64
"""Most packed query rows (GQA group × query positions) per program the kernel takes."""
DISPATCH_MAX_LQ = 1
"""Longest query chunk the decoder dispatches here: decode steps only (prefill stays on SDPA)."""
BLOCK_N = 64
"""Keys per tile."""
MIN_SPLIT_KEYS = 1024
"""Fewest cache positions one split covers. H200 sweep (batch 64, Llama-3.1-8B heads, BF16 and
FP8 caches): 448 keys fastest unsplit, 2,176 keys with 2–4 splits, 4,160 keys with 4–8."""
TARGET_PROGRAMS = 16 * 132
"""Split until about this many programs (16 per H200 SM) run, within ``MIN_SPLIT_KEYS``."""
_ENABLED = [False]
"""Whether the decoder's fast path dispatches decode steps here (see ``set_enabled``)."""


def set_enabled(on: bool) -> bool:
    """Let the fast path's decode steps run ``decode_attention`` (process-wide); returns the
    previous setting. Off (the default, module doc: fast-mode parity): the decoder's
    ``invariant.attention`` runs. Exact mode never uses the kernel."""
    previous, _ENABLED[0] = _ENABLED[0], bool(on)
    return previous


def enabled() -> bool:
    """The current ``set_enabled`` setting."""
    return _ENABLED[0]


def use_decode_attention(q: Tensor, kv_heads: int, *, exact: bool) -> bool:
    """Whether a cache step with query ``q`` [B, H, Lq, D] goes to the split-KV kernel: enabled,
    fast mode, CUDA, BF16/FP16 activations, no autograd, ``Lq ≤ DISPATCH_MAX_LQ``,
    ``(H / kv_heads) · Lq ≤ MAX_ROWS`` and D a power of two in 16…256 (prefill chunks and the
    trainer stay on ``invariant.attention``)."""
    if exact or not _ENABLED[0] or not q.is_cuda or torch.is_grad_enabled():
        return False
    d = q.shape[-1]
    return (
        q.dtype in (torch.bfloat16, torch.float16)
        and q.shape[2] <= DISPATCH_MAX_LQ
        and (q.shape[1] // kv_heads) * q.shape[2] <= MAX_ROWS
        and 16 <= d <= 256
        and d & (d - 1) == 0
    )


def num_splits(batch: int, kv_heads: int, capacity: int) -> int:
    """Splits of the key axis for a (batch, KV heads, capacity) launch: enough programs to fill
    the GPU (``TARGET_PROGRAMS``), each split at least ``MIN_SPLIT_KEYS`` positions. A function
    of shapes only, so a CUDA graph captures it."""
    want = math.ceil(TARGET_PROGRAMS / max(1, batch * kv_heads))
    return max(1, min(want, math.ceil(capacity / MIN_SPLIT_KEYS)))


def decode_attention_reference(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    positions: Tensor,
    k_len: Tensor,
    *,
    scale: float,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> Tensor:
    """Float64 attention of ``q`` over the cache, rounded once to ``q.dtype`` (pure torch).

    Args: as ``decode_attention``. An FP8 cache is first dequantized like ``kv.kv_dequantize``
    (the values the engine and the trainer's round trip see). Returns [B, H, Lq, D].
    """
    k, v = k_cache, v_cache
    if k.dtype == torch.float8_e4m3fn:
        k, v = kv_dequantize(k, k_scale, q.dtype), kv_dequantize(v, v_scale, q.dtype)
    groups = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(groups, dim=1)
    v = v.double().repeat_interleave(groups, dim=1)
    j = torch.arange(k.shape[2], device=q.device)
    visible = (j[None, None, :] <= positions[:, :, None]) & (
        j[None, None, :] < k_len[:, None, None]
    )
    scores = torch.matmul(q.double(), k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v).to(q.dtype)


def decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    positions: Tensor,
    k_len: Tensor,
    *,
    scale: float,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    splits: int | None = None,
    block_n: int = BLOCK_N,
) -> Tensor:
    """Attention of a decode step's queries over a KV cache, read in place (GQA, causal).

    Args:
        q: [B, H, Lq, D] BF16/FP16 queries (RoPE applied), H a multiple of Hkv; last dim unit
            stride.
        k_cache, v_cache: [B, Hkv, C, D] in q.dtype, or float8_e4m3fn codes (then ``k_scale``,
            ``v_scale`` are required); key index = position; a ``[:, :, :limit]`` view is fine.
        positions: [B, Lq] int64 position of each query (it sees keys ``j ≤ position``).
        k_len: [B] int valid keys per sequence (keys ``j ≥ k_len`` are ignored); ≥ 1.
        scale: softmax scale (usually D**-0.5).
        k_scale, v_scale: 0-d float32 per-tensor FP8 scales (value = code · scale).
        splits: override ``num_splits`` (benchmarks).
        block_n: keys per tile, a power of two ≥ 16 (benchmarks; 128 halves the FP8 tile count).
    Returns:
        [B, H, Lq, D] in q.dtype.
    Raises:
        ValueError: an FP8 cache without scales, or mismatched shapes.
    """
    b, h, _, d = q.shape
    kv_heads = k_cache.shape[1]
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8 and (k_scale is None or v_scale is None):
        raise ValueError("an FP8 KV cache needs k_scale and v_scale")
    if h % kv_heads or k_cache.shape != v_cache.shape or k_cache.shape[::3] != (b, d):
        raise ValueError(
            f"q {tuple(q.shape)} does not match caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)}"
        )
    if not q.is_cuda:
        return decode_attention_reference(
            q, k_cache, v_cache, positions, k_len, scale=scale, k_scale=k_scale, v_scale=v_scale
        )
    return _launch(q, k_cache, v_cache, positions, k_len, scale, k_scale, v_scale, splits, block_n)


def _launch(
    q, k_cache, v_cache, positions, k_len, scale, k_scale, v_scale, splits, block_n=BLOCK_N
) -> Tensor:
    """Run the Triton kernels (also on CPU tensors under ``TRITON_INTERPRET=1``, for tests)."""
    from fp8rl.kernels import decode_attention_triton as kern

    b, h, lq, d = q.shape
    kv_heads, capacity = k_cache.shape[1], k_cache.shape[2]
    fp8 = k_cache.dtype == torch.float8_e4m3fn

    if q.stride(-1) != 1:
        q = q.contiguous()
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "cache rows must be contiguous"
    groups = h // kv_heads
    block_m = max(16, 1 << (groups * lq - 1).bit_length())
    n_split = splits or num_splits(b, kv_heads, capacity)
    split_len = -(-math.ceil(capacity / n_split) // block_n) * block_n
    out = torch.empty((b, h, lq, d), dtype=q.dtype, device=q.device)
    if n_split > 1:
        m = torch.empty((b, kv_heads, n_split, block_m), dtype=torch.float32, device=q.device)
        l_sum = torch.empty_like(m)
        acc = torch.empty((*m.shape, d), dtype=torch.float32, device=q.device)
    else:
        m = l_sum = acc = out  # unused by the one-split kernel
    scales = (k_scale, v_scale) if fp8 else (k_len, k_len)  # unused without FP8
    positions = positions.to(torch.int64).contiguous()
    k_len = k_len.to(torch.int64)
    kern._split_kernel[(b, kv_heads, n_split)](
        q,
        k_cache,
        v_cache,
        positions,
        k_len,
        *scales,
        m,
        l_sum,
        acc,
        out,
        scale * math.log2(math.e),
        split_len,
        n_split,
        capacity,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        positions.stride(0),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        GROUPS=groups,
        LQ=lq,
        HEAD_DIM=d,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        ONE_SPLIT=n_split == 1,
        KV_FP8=fp8,
        num_warps=4,
        num_stages=3,
    )
    if n_split > 1:
        kern._reduce_kernel[(b, kv_heads)](
            m,
            l_sum,
            acc,
            out,
            n_split,
            out.stride(0),
            out.stride(1),
            out.stride(2),
            GROUPS=groups,
            LQ=lq,
            HEAD_DIM=d,
            BLOCK_M=block_m,
            num_warps=4,
        )
    return out
