"""Blockwise-scaled FP8 GEMM ``a · bᵀ`` for FProp, DGrad and WGrad, and its exact CPU emulation.

Design notes
------------
Both operands are ``QuantizedTensor``s whose groups run along the contraction dimension (the last
dim of both): ``block[1] == 128``; ``block[0]`` is 1 (row groups) or 128 (square blocks). That one
shape covers the three GEMMs of DESIGN.md §2:

* FProp  ``Y = X·Wᵀ``:   a = X (1×128),        b = W (128×128)
* DGrad  ``∇X = ∇Y·W``:  a = ∇Y (1×128),       b = Wᵀ = ``w.t()`` (128×128, the same blocks)
* WGrad  ``∇W = ∇Yᵀ·X``: a = ``col(∇Y).t()``,  b = ``col(X).t()`` (both 1×128 along tokens)

**CPU / exact emulation** (``fp8_gemm_reference``). For every 128-wide K block the partial
product of the E4M3 codes is computed in float64. That is *exact*: a product of two E4M3 values
has at most 8 significant bits and lies in [2**-18, 2**17.6]; any partial sum of up to 128 of them
is a multiple of 2**-18 below 2**25, i.e. fits in 43 < 53 bits, so no summation order can change
it. The two float32 scales are multiplied first (exact in float64: 24+24 bits), the partial is
multiplied by that product (one rounding), and the K blocks are accumulated in ascending order
with elementwise adds. Every step is elementwise or exact, so a row's output is bitwise
independent of M and of the row's position in the batch. (A single float64 matmul over all of K
with the scales folded into the operands is *not*: measured, 1-row and 64-row results differ.)

**GPU.** ``torch.nn.functional.scaled_mm`` (cuBLASLt, BlockWise1x128 / BlockWise128x128, Hopper
only; both scale tensors outer-dim-major, see ``scaled_mm_scales``), DeepGEMM when importable, and
the Triton kernel of ``gemm_triton.py`` for ``exact=True`` and every shape the libraries refuse.
The decode-size kernel (``gemm_decode_triton``) takes FProp up to M = 256: in fast mode at its
measured parity-safe rows, in exact mode at every such M (``exact_config``, rows bitwise the
fixed-tile kernel's).
The backend name is ``backend.kernel_backend`` (checked at the start of a run). Refusals are
remembered per shape class so a refused shape costs one exception per process.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from fp8rl.kernels.backend import (
    deepgemm_available,
    scaled_mm_blockwise_available,
    triton_available,
)
from fp8rl.kernels.quant import GROUP, QuantizedTensor

MIN_LIBRARY_ROWS = 16
"""Fewer rows go straight to Triton: cuBLASLt's blockwise heuristic returns NOT_SUPPORTED for
M = 1 on the H200 (torch 2.11, CUDA 13.0), and Triton matched it at M = 1 anyway."""

_REFUSED: set[tuple] = set()
"""Shape classes a library backend refused in this process (they go to Triton from then on)."""


def _check_operands(a: QuantizedTensor, b: QuantizedTensor) -> None:
    if a.block[1] != GROUP or b.block[1] != GROUP:
        raise ValueError(
            "fp8_gemm contracts over the last dim of both operands, which must carry the "
            f"128-wide groups: got a.block={a.block}, b.block={b.block} (use .t() on a 128x1 tensor)"
        )
    if b.codes.dim() != 2:
        raise ValueError(f"b must be 2-D [N, K], got shape {tuple(b.shape)}")
    if a.block != (1, GROUP) and a.codes.dim() != 2:
        raise ValueError(f"a with block {a.block} must be 2-D, got shape {tuple(a.shape)}")
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(
            f"contraction dims differ: a is {tuple(a.shape)}, b is {tuple(b.shape)} (a·bᵀ needs "
            "equal last dims)"
        )
    if a.codes.device != b.codes.device:
        raise ValueError(f"a on {a.codes.device} but b on {b.codes.device}")


def _flatten(a: QuantizedTensor) -> QuantizedTensor:
    if a.codes.dim() == 2:
        return a
    k = a.shape[-1]
    return QuantizedTensor(a.codes.reshape(-1, k), a.scale.reshape(-1, a.scale.shape[-1]), a.block)


def row_scales(q: QuantizedTensor) -> Tensor:
    """The scale of a 2-D operand repeated to one row per data row: ``[rows, ceil(K/128)]``."""
    if q.block[0] == 1:
        return q.scale
    return q.scale.repeat_interleave(q.block[0], dim=0)[: q.shape[0]]


def fp8_gemm_reference(
    a: QuantizedTensor, b: QuantizedTensor, *, out_dtype: torch.dtype = torch.float32
) -> Tensor:
    """Exact, batch-invariant emulation of ``a · bᵀ`` (any device; the CPU truth).

    Args:
        a: ``[..., K]`` (1,128) or ``[M, K]`` (128,128) quantized operand.
        b: ``[N, K]`` with block (1,128) or (128,128).
        out_dtype: dtype of the result (the float64 sum is rounded once to it).
    Returns:
        ``[..., N]``: ``sum_kb (A_kb · B_kbᵀ) * (sa_kb ⊗ sb_kb)`` accumulated in float64 in
        ascending K-block order (see module doc for why this is exact per block).
    """
    _check_operands(a, b)
    lead = a.shape[:-1]
    a2 = _flatten(a)
    k = a2.shape[1]
    codes_a, scale_a = a2.codes.to(torch.float64), row_scales(a2).to(torch.float64)
    scale_b = row_scales(b).to(torch.float64)
    out = torch.zeros(a2.shape[0], b.shape[0], dtype=torch.float64, device=a2.codes.device)
    for kb in range(scale_a.shape[1]):
        cols = slice(kb * GROUP, min(k, (kb + 1) * GROUP))
        # the weight's float64 copy is made one K-block at a time and not kept: a cached
        # float64 copy of every weight cost 8 bytes per parameter in each FP8 process
        partial = codes_a[:, cols] @ b.codes[:, cols].to(torch.float64).t()
        out += partial * (scale_a[:, kb, None] * scale_b[None, :, kb])
    return out.to(out_dtype).reshape(*lead, b.shape[0])


def fp8_gemm_dequantized(
    a: QuantizedTensor, b: QuantizedTensor, *, out_dtype: torch.dtype
) -> Tensor:
    """``a · bᵀ`` from dequantized float32 operands in one GEMM (CPU backward path).

    Same FP8 values as the exact emulation, accumulated by BLAS in float32: not batch-invariant,
    which the backward pass does not need, and several times faster on CPU than the per-block
    float64 loop. Shapes as ``fp8_gemm``.
    """
    _check_operands(a, b)
    lead = a.shape[:-1]
    a2 = _flatten(a)
    out = a2.dequantize(torch.float32) @ b.dequantize(torch.float32).t()
    return out.to(out_dtype).reshape(*lead, b.shape[0])


# ---------------------------------------------------------------------------------------------
# library backends


def _outer_major(scale: Tensor) -> Tensor:
    """A 2-D scale with stride (1, rows): stored transposed (cuBLASLt's 1×128 layout).

    Built with explicit strides: ``scale.t().contiguous().t()`` keeps a (1, K) stride pattern
    for a single row (size-1 dims count as contiguous), which cuBLASLt refuses for M = 1.
    """
    rows, cols = scale.shape
    if scale.stride() == (1, rows):
        return scale
    out = torch.empty_strided((rows, cols), (1, rows), dtype=scale.dtype, device=scale.device)
    return out.copy_(scale)


def scaled_mm_scales(q: QuantizedTensor) -> Tensor:
    """``q``'s scale in the layout ``torch.nn.functional.scaled_mm`` blockwise scaling wants.

    1×128 operand ``[rows, K]``: logical ``[rows, ceil(K/128)]`` with stride ``(1, rows)``.
    128×128 operand ``[rows, K]``: ``[round_up(ceil(K/128), 4), ceil(rows/128)]`` with stride
    ``(1, L4)``; the padded K-block entries are initialised to 1.0 and never multiply real data.
    The logical scale of ``q`` is not changed. A row-major 128×128 scale whose K-block count is a
    multiple of 4 (every 7B/8B linear) already is that layout: its transposed view is returned
    (when 16-byte aligned) and nothing is copied (no kernel, no allocation: this runs on every FP8 linear call, whose
    eager time is CPU-bound); otherwise, or when the layout differs, this is a copy.
    """
    if q.block == (1, GROUP):
        return _outer_major(q.scale)
    blocks_rows, blocks_k = q.scale.shape
    padded_k = -(-blocks_k // 4) * 4
    aligned = q.scale.data_ptr() % 16 == 0  # a received flat buffer's slice may not be
    if padded_k == blocks_k and q.scale.stride() == (blocks_k, 1) and aligned:
        return q.scale.t()
    layout = torch.ones(blocks_rows, padded_k, dtype=torch.float32, device=q.scale.device)
    layout[:, :blocks_k] = q.scale
    return layout.t()


def k_major(codes: Tensor) -> Tensor:
    """``codes`` as a row-major (K-contiguous) tensor. A transposed view of a row-major 2-D
    tensor (DGrad's ``Wᵀ``) is copied by the tiled Triton transpose on CUDA
    (``transpose_triton``), anything else by ``contiguous()``; same bits either way."""
    if codes.is_contiguous():
        return codes
    if codes.is_cuda and codes.dim() == 2 and codes.t().is_contiguous() and triton_available():
        from fp8rl.kernels.transpose_triton import transpose_codes

        return transpose_codes(codes.t())
    return codes.contiguous()


def _recipe(block: tuple[int, int]):
    scaling = torch.nn.functional.ScalingType
    return scaling.BlockWise1x128 if block == (1, GROUP) else scaling.BlockWise128x128


def _scaled_mm(a: QuantizedTensor, b: QuantizedTensor, out_dtype: torch.dtype) -> Tensor:
    mat_a = k_major(a.codes)
    mat_b = k_major(b.codes).t()  # [K, N] column-major
    return torch.nn.functional.scaled_mm(
        mat_a,
        mat_b,
        scaled_mm_scales(a),
        _recipe(a.block),
        scaled_mm_scales(b),
        _recipe(b.block),
        output_dtype=out_dtype,
    )


def _deepgemm(a: QuantizedTensor, b: QuantizedTensor, out_dtype: torch.dtype) -> Tensor:
    import deep_gemm  # optional; not installed on the machines fp8rl is tested on

    out = torch.empty(a.shape[0], b.shape[0], dtype=out_dtype, device=a.codes.device)
    deep_gemm.fp8_gemm_nt(
        (k_major(a.codes), a.scale.contiguous()),
        (k_major(b.codes), b.scale.contiguous()),
        out,
    )
    return out


def _library_gemm(
    name: str, a: QuantizedTensor, b: QuantizedTensor, out_dtype: torch.dtype
) -> Tensor | None:
    """Run a library backend, or return None when it does not take this shape class."""
    m, k = a.shape
    n = b.shape[0]
    supported_pair = (a.block, b.block) != ((GROUP, GROUP), (GROUP, GROUP))
    if name == "deepgemm":
        supported_pair = a.block == (1, GROUP) and b.block == (GROUP, GROUP)
    key = (name, a.block, b.block, out_dtype, m % 16 == 0, n, k)
    if (
        not supported_pair
        or m < MIN_LIBRARY_ROWS
        or k % GROUP
        or n % 16
        or out_dtype not in (torch.bfloat16, torch.float32)
    ):
        return None
    if key in _REFUSED:
        return None
    try:
        return (_scaled_mm if name == "scaled_mm" else _deepgemm)(a, b, out_dtype)
    except (RuntimeError, ValueError, NotImplementedError, TypeError) as err:
        _REFUSED.add(key)
        warnings.warn(
            f"{name} refused FP8 GEMM shape class {key[1:]} ({err}); using the Triton kernel",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def _decode_sized(a: QuantizedTensor, b: QuantizedTensor, exact: bool) -> bool:
    """FProp shapes the decode kernel takes: 1×128 · 128×128 (weight K-contiguous). Fast mode:
    at an (M bucket, N, K) ``decode_wins`` gives to it (by default only the measured parity-safe
    rows, bitwise the ``scaled_mm`` rows the trainer computes); exact mode: up to
    ``gemm_decode_triton.MAX_TABLE_ROWS`` rows (``exact_config``: bitwise the fixed-tile rows)."""
    from fp8rl.kernels import gemm_decode_triton as dec

    if a.block != (1, GROUP) or b.block != (GROUP, GROUP) or b.codes.stride(-1) != 1:
        return False
    m, k = a.shape
    if exact:
        return m <= dec.MAX_TABLE_ROWS
    return dec.decode_wins(m, b.shape[0], k)


def fp8_gemm(
    a: QuantizedTensor, b: QuantizedTensor, *, out_dtype: torch.dtype, exact: bool = False
) -> Tensor:
    """Blockwise-scaled FP8 matrix product ``a · bᵀ`` (contraction over the last dim of both).

    Args:
        a: ``[..., K]`` with block (1,128), or ``[M, K]`` with block (128,128).
        b: ``[N, K]`` with block (1,128) or (128,128) (for a 128×1 tensor pass ``q.t()``).
        out_dtype: result dtype (bfloat16/float32; the CPU emulation takes any float dtype).
        exact: batch-invariant mode: a row's result is bitwise independent of the other rows
            (Triton, fixed tiles, no split-K on CUDA, the decode kernel's bitwise-equal
            ``exact_config`` up to M = 256; the CPU emulation is always exact). The fast mode runs the decode-size kernel where its tuned table has a parity-safe row
            that beat ``scaled_mm`` (``gemm_decode_triton.decode_wins``: its rows are bitwise
            the library's at the trainer's M), the library or tiled Triton kernel elsewhere.
    Returns:
        ``[..., N]`` in ``out_dtype``.
    Raises:
        ValueError: groups not along the contraction dim, shape or device mismatch.
    Backend: ``backend.kernel_backend(device, exact=exact)``; see the module doc.
    """
    _check_operands(a, b)
    device = a.codes.device
    if device.type != "cuda":
        return fp8_gemm_reference(a, b, out_dtype=out_dtype)
    lead = a.shape[:-1]
    a2 = _flatten(a)
    out = None
    if triton_available() and _decode_sized(a2, b, exact):
        from fp8rl.kernels import gemm_decode_triton

        m, n, k = a2.shape[0], b.shape[0], a2.shape[1]
        config = gemm_decode_triton.exact_config(m, n, k) if exact else None
        out = gemm_decode_triton.fp8_gemm_decode(a2, b, out_dtype=out_dtype, config=config)[0]
    if out is None and not exact:
        if deepgemm_available():
            out = _library_gemm("deepgemm", a2, b, out_dtype)
        if out is None and scaled_mm_blockwise_available(device):
            out = _library_gemm("scaled_mm", a2, b, out_dtype)
    if out is None:
        if not triton_available():
            return fp8_gemm_reference(a, b, out_dtype=out_dtype)
        from fp8rl.kernels import gemm_triton

        out = gemm_triton.fp8_gemm_triton(a2, b, out_dtype=out_dtype, exact=exact)
    return out.reshape(*lead, b.shape[0])
