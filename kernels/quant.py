"""FP8 (E4M3) quantizers at the three granularities of the Jet-RL precision flow.

Design notes
------------
* One scale rule everywhere (DESIGN.md §2): ``scale = max(amax / 448, 2**-126)`` computed in
  float32 with IEEE round-to-nearest division, optionally rounded *up* to a power of two
  (``scale_format="pow2"``, the UE8M0 option of DeepSeek-V3 / DeepGEMM). The power-of-two rounding
  is done on the float32 bits (clear the mantissa, bump the exponent when the mantissa was not
  zero), which is exact; ``log2``/``ceil`` is not.
* The floor ``2**-126`` (float32's smallest normal, ``MIN_SCALE``) is what makes an all-zero group
  safe: its scale is ``MIN_SCALE`` (finite, non-zero, itself a power of two), its codes are 0, and
  nothing ever computes 0/0. The same floor keeps tiny groups from underflowing to a zero scale.
* Codes are ``clamp(x / scale, -448, 448)`` cast to ``float8_e4m3fn`` (round to nearest even).
  The clamp comes *before* the cast: ``torch`` casts 465 to NaN, not to 448.
* Non-finite input is an error, not a NaN scale. The check costs one ``isfinite`` reduction over
  the amax tensor (1/128 of the data) and, on CUDA, one host sync, or no sync inside
  ``finite.deferred_finite_checks()`` (what the trainers run); it is skipped while a stream is
  capturing a CUDA graph.
* Every quantizer is an elementwise function of its group, so a row's codes never depend on the
  batch size or on the row's position: M=1 and M=4096 run the same code path.
* The pure-torch ``*_reference`` functions are the CPU truth. On CUDA the public wrappers launch
  the Triton kernels of ``quant_triton.py``, which are tested to be *bitwise* equal to these
  references (``tests/fp8_kernels/test_kernels_gpu.py``).
* ``QuantizedTensor.scale`` always has the *logical* grid shape (e.g. ``[M, ceil(K/128)]``); the
  storage may be transposed for a backend (the Triton per-token quantizer writes it M-major, the
  layout ``torch.nn.functional.scaled_mm`` wants). Compare scales by value, never by stride.

Sources: DeepSeek-V3 tech report §3.3 (fine-grained 1×128 / 128×128 quantization), Jet-RL
(arXiv 2601.14243) method step 4 (re-quantize the saved FP8 activation into 128×1 groups for
WGrad), DeepGEMM ``deep_gemm/utils/math.py`` (naming, UE8M0 rounding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from fp8rl.kernels.finite import raise_if_not_finite, should_check_finite

FP8_E4M3_MAX = 448.0
"""Largest finite ``float8_e4m3fn`` value (OCP FP8 spec)."""

FP8_DTYPE = torch.float8_e4m3fn
"""The one FP8 element type fp8rl uses, for forward and backward."""

GROUP = 128
"""Group / block edge of every granularity (1×128, 128×128, 128×1)."""

MIN_SCALE = 2.0**-126
"""Scale floor: float32's smallest normal. All-zero groups get exactly this scale."""

ScaleFormat = Literal["fp32", "pow2"]
BLOCKS = ((1, GROUP), (GROUP, GROUP), (GROUP, 1))
"""The granularities a ``QuantizedTensor`` may carry: row groups, square blocks, column groups."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def scale_grid_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    """The logical scale shape for data of ``shape`` quantized with ``block``.

    (1,128): ``[..., ceil(K/128)]``; (128,128): ``[ceil(N/128), ceil(K/128)]``;
    (128,1): ``[ceil(M/128), K]``. Raises ``ValueError`` for an unknown block or a block that
    needs 2-D data.
    """
    if block not in BLOCKS:
        raise ValueError(f"block must be one of {BLOCKS}, got {block}")
    if len(shape) < 1 or (block != (1, GROUP) and len(shape) != 2):
        raise ValueError(f"block {block} needs a 2-D tensor, got shape {tuple(shape)}")
    if block == (1, GROUP):
        return (*shape[:-1], _cdiv(shape[-1], GROUP))
    rows, cols = shape
    return (_cdiv(rows, block[0]), _cdiv(cols, block[1]))


@dataclass(frozen=True)
class QuantizedTensor:
    """FP8 codes + float32 dequantization scales + the granularity: ``x ≈ codes * scale``.

    Attributes:
        codes: ``float8_e4m3fn`` tensor of the logical shape (``[..., K]`` for (1,128),
            ``[N, K]`` / ``[M, K]`` for the 2-D granularities). Any strides.
        scale: float32 multipliers of the logical grid ``scale_grid_shape(codes.shape, block)``;
            any strides (a backend may keep them transposed).
        block: ``(1, 128)`` row groups, ``(128, 128)`` blocks or ``(128, 1)`` column groups.

    Raises ``ValueError`` when dtypes, block or the scale grid do not match.
    """

    codes: Tensor
    scale: Tensor
    block: tuple[int, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "block", tuple(self.block))
        if self.codes.dtype != FP8_DTYPE:
            raise ValueError(f"codes must be {FP8_DTYPE}, got {self.codes.dtype}")
        if self.scale.dtype != torch.float32:
            raise ValueError(f"scale must be torch.float32, got {self.scale.dtype}")
        expected = scale_grid_shape(tuple(self.codes.shape), self.block)
        if tuple(self.scale.shape) != expected:
            raise ValueError(
                f"scale shape {tuple(self.scale.shape)} does not match codes "
                f"{tuple(self.codes.shape)} with block {self.block}: expected {expected}"
            )
        if self.codes.device != self.scale.device:
            raise ValueError(
                f"codes on {self.codes.device} but scale on {self.scale.device}: same device needed"
            )

    @property
    def shape(self) -> torch.Size:
        """The logical shape (that of ``codes``)."""
        return self.codes.shape

    def t(self) -> QuantizedTensor:
        """The transpose of a 2-D quantized tensor (views; the block is transposed too)."""
        if self.codes.dim() != 2:
            raise ValueError(f"t() needs a 2-D QuantizedTensor, got shape {tuple(self.shape)}")
        return QuantizedTensor(self.codes.t(), self.scale.t(), (self.block[1], self.block[0]))

    def expanded_scale(self) -> Tensor:
        """The scale broadcast to one value per element (float32, the logical shape)."""
        scale = self.scale
        if self.block[0] != 1:
            scale = scale.repeat_interleave(self.block[0], dim=-2)[..., : self.shape[-2], :]
        if self.block[1] != 1:
            scale = scale.repeat_interleave(self.block[1], dim=-1)[..., : self.shape[-1]]
        return scale

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """``codes * scale`` in ``dtype`` (computed in float32, or exactly in float64 for float64)."""
        work = torch.float64 if dtype == torch.float64 else torch.float32
        return (self.codes.to(work) * self.expanded_scale().to(work)).to(dtype)


# ---------------------------------------------------------------------------------------------
# the scale rule (shared by every reference; the Triton kernels implement the same bit ops)


def _check_scale_format(scale_format: str) -> None:
    if scale_format not in ("fp32", "pow2"):
        raise ValueError(f"scale_format must be 'fp32' or 'pow2', got {scale_format!r}")


def round_up_pow2(scale: Tensor) -> Tensor:
    """Round positive, finite, normal float32 values up to the next power of two (exact, bitwise).

    Clears the 23 mantissa bits and adds one to the exponent when any was set. Same result as
    ``ldexp(1, frexp(s).exponent)`` for non-powers of two and the identity on powers of two.
    """
    bits = scale.contiguous().view(torch.int32)
    exponent = torch.bitwise_and(bits, 0x7F800000)
    bump = (torch.bitwise_and(bits, 0x007FFFFF) != 0).to(torch.int32) * (1 << 23)
    return (exponent + bump).view(torch.float32).view(scale.shape)


def scale_from_amax(amax: Tensor, *, scale_format: ScaleFormat = "fp32") -> Tensor:
    """float32 dequantization scale of groups with absolute maximum ``amax`` (float32, finite).

    ``max(amax / 448, 2**-126)``, rounded up to a power of two for ``pow2``.
    """
    scale = torch.clamp(amax.to(torch.float32) / FP8_E4M3_MAX, min=MIN_SCALE)
    return round_up_pow2(scale) if scale_format == "pow2" else scale


def _to_codes(values: Tensor) -> Tensor:
    """Clamp float32 ``values`` (already divided by their scale) to ±448, then cast to E4M3."""
    return values.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_DTYPE)


def _check_input(x: Tensor, name: str, *, dims: int | None = None) -> None:
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"{name}: expected float32/bfloat16/float16, got {x.dtype}")
    if dims is not None and x.dim() != dims:
        raise ValueError(f"{name}: expected a {dims}-D tensor, got shape {tuple(x.shape)}")
    if dims is None and x.dim() < 1:
        raise ValueError(f"{name}: expected at least 1 dimension, got a scalar")


# ---------------------------------------------------------------------------------------------
# pure-torch references (the CPU truth)


def _grouped_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """``x [..., K]`` as float32 ``[..., G, 128]`` (zero padded; zeros never raise an amax) + amax."""
    k = x.shape[-1]
    groups = _cdiv(k, GROUP)
    xf = x.to(torch.float32)
    if groups * GROUP != k:
        xf = F.pad(xf, (0, groups * GROUP - k))
    grouped = xf.reshape(*x.shape[:-1], groups, GROUP)
    return grouped, grouped.abs().amax(dim=-1)


def _row_codes(x: Tensor, grouped: Tensor, amax: Tensor, scale_format: str) -> QuantizedTensor:
    k = x.shape[-1]
    scale = scale_from_amax(amax, scale_format=scale_format)
    codes = _to_codes(grouped / scale.unsqueeze(-1)).flatten(-2)  # [..., G*128], also for 0 rows
    if codes.shape[-1] != k:
        codes = codes[..., :k].contiguous()
    return QuantizedTensor(codes, scale, (1, GROUP))


def per_token_group_quant_reference(
    x: Tensor, *, scale_format: ScaleFormat = "fp32", name: str = "x", check_finite: bool = True
) -> QuantizedTensor:
    """Reference 1×128 quantizer: one scale per row per 128 consecutive elements of the last dim.

    Args:
        x: ``[..., K]`` float32/bfloat16/float16 (rows are tokens, K features).
        scale_format: ``"fp32"`` (amax/448) or ``"pow2"`` (rounded up to a power of two).
        name: how error messages call ``x``.
        check_finite: raise ``ValueError`` on NaN/inf input (default).
    Returns:
        ``QuantizedTensor`` with codes ``[..., K]`` and scale ``[..., ceil(K/128)]``, block (1,128).
    """
    _check_scale_format(scale_format)
    _check_input(x, name)
    grouped, amax = _grouped_rows(x)
    if should_check_finite(check_finite, x.device):
        raise_if_not_finite(amax, name=name, what="a 1x128 row group")
    return _row_codes(x, grouped, amax, scale_format)


def per_block_quant_reference(
    w: Tensor, *, scale_format: ScaleFormat = "fp32", name: str = "w", check_finite: bool = True
) -> QuantizedTensor:
    """Reference 128×128 quantizer for a weight ``w [N, K]``: one scale per 128×128 block.

    Returns codes ``[N, K]`` and scale ``[ceil(N/128), ceil(K/128)]``, block (128,128).
    Partial edge blocks are zero padded for the amax only.
    """
    _check_scale_format(scale_format)
    _check_input(w, name, dims=2)
    n, k = w.shape
    nb, kb = _cdiv(n, GROUP), _cdiv(k, GROUP)
    wf = F.pad(w.to(torch.float32), (0, kb * GROUP - k, 0, nb * GROUP - n))
    blocks = wf.reshape(nb, GROUP, kb, GROUP)
    amax = blocks.abs().amax(dim=(1, 3))
    if should_check_finite(check_finite, w.device):
        raise_if_not_finite(amax, name=name, what="a 128x128 block")
    scale = scale_from_amax(amax, scale_format=scale_format)
    codes = _to_codes(blocks / scale[:, None, :, None]).reshape(nb * GROUP, kb * GROUP)
    return QuantizedTensor(codes[:n, :k].contiguous(), scale, (GROUP, GROUP))


def per_column_group_quant_reference(
    x: Tensor, *, scale_format: ScaleFormat = "fp32", name: str = "x", check_finite: bool = True
) -> QuantizedTensor:
    """Reference 128×1 quantizer for ``x [M, K]``: one scale per 128 rows (tokens) per column.

    Returns codes ``[M, K]`` (a transposed view: the storage is K-major, which is what WGrad
    reads) and scale ``[ceil(M/128), K]``, block (128,1).
    """
    _check_scale_format(scale_format)
    _check_input(x, name, dims=2)
    grouped, amax = _grouped_rows(x.t())
    if should_check_finite(check_finite, x.device):
        raise_if_not_finite(amax.t(), name=name, what="a 128x1 column group")
    return _row_codes(x.t(), grouped, amax, scale_format).t()


def requant_to_column_groups_reference(
    q: QuantizedTensor, *, scale_format: ScaleFormat = "fp32", name: str = "x"
) -> QuantizedTensor:
    """Reference re-quantization of a saved 1×128 FP8 activation into 128×1 column groups.

    ``q``: codes ``[..., K]``, block (1,128) (leading dims are flattened into M tokens).
    Dequantizes in float32 (``codes * scale``, one rounding) and quantizes the result with
    ``per_column_group_quant_reference``: Jet-RL step 4, WGrad never sees a BF16 activation.
    """
    flat = _flatten_row_groups(q, name)
    return per_column_group_quant_reference(
        flat.dequantize(torch.float32), scale_format=scale_format, name=name, check_finite=False
    )


def _flatten_row_groups(q: QuantizedTensor, name: str) -> QuantizedTensor:
    if q.block != (1, GROUP):
        raise ValueError(f"{name}: expected a (1, {GROUP}) row-group tensor, got block {q.block}")
    k = q.shape[-1]
    return QuantizedTensor(q.codes.reshape(-1, k), q.scale.reshape(-1, q.scale.shape[-1]), q.block)


# ---------------------------------------------------------------------------------------------
# public wrappers: Triton on CUDA, the reference elsewhere


def _use_triton(x: Tensor) -> bool:
    from fp8rl.kernels.backend import triton_available

    return x.is_cuda and triton_available()


def per_token_group_quant(
    x: Tensor, *, scale_format: ScaleFormat = "fp32", name: str = "x", check_finite: bool = True
) -> QuantizedTensor:
    """Quantize ``x [..., K]`` to E4M3 with one scale per row per 128 elements of the last dim.

    The 1×128 granularity of activations (FProp), output gradients (DGrad) — DeepSeek-V3 §3.3.
    Args:
        x: float32/bfloat16/float16 ``[..., K]``; K need not be a multiple of 128 (partial last group).
        scale_format: ``"fp32"``: scale = amax/448; ``"pow2"``: rounded up to a power of two.
        name: what error messages call ``x``.
        check_finite: raise on NaN/inf (one reduction; skipped during CUDA graph capture).
    Returns:
        ``QuantizedTensor(codes [..., K] float8_e4m3fn, scale [..., ceil(K/128)] float32, (1,128))``.
        All-zero groups: codes 0, scale ``MIN_SCALE`` (2**-126).
    Raises:
        ValueError: bad dtype / scale_format, or a NaN/inf in ``x`` (message names the group).
    """
    _check_scale_format(scale_format)
    _check_input(x, name)
    if _use_triton(x):
        from fp8rl.kernels import quant_triton

        q = quant_triton.per_token_group_quant_triton(x, scale_format=scale_format)
        if should_check_finite(check_finite, x.device):
            raise_if_not_finite(q.scale, name=name, what="a 1x128 row group")
        return q
    return per_token_group_quant_reference(
        x, scale_format=scale_format, name=name, check_finite=check_finite
    )


def per_block_quant(
    w: Tensor,
    *,
    scale_format: ScaleFormat = "fp32",
    name: str = "w",
    check_finite: bool = True,
    out: QuantizedTensor | None = None,
) -> QuantizedTensor:
    """Quantize a weight ``w [N, K]`` to E4M3 with one scale per 128×128 block.

    Returns ``QuantizedTensor(codes [N, K], scale [ceil(N/128), ceil(K/128)], (128,128))``.
    Same scale rule, edge rules and errors as ``per_token_group_quant`` (DeepSeek-V3 §3.3).
    ``out``: write into these row-major codes/scale (e.g. row slices of a fused weight) and
    return it; the Triton kernel writes there directly, the reference copies.
    """
    _check_scale_format(scale_format)
    _check_input(w, name, dims=2)
    if out is not None and (out.shape != w.shape or out.block != (GROUP, GROUP)):
        raise ValueError(f"{name}: out is {tuple(out.shape)} {out.block}, w is {tuple(w.shape)}")
    if _use_triton(w):
        from fp8rl.kernels import quant_triton

        q = quant_triton.per_block_quant_triton(w, scale_format=scale_format, out=out)
        if should_check_finite(check_finite, w.device):
            raise_if_not_finite(q.scale, name=name, what="a 128x128 block")
        return q
    q = per_block_quant_reference(
        w, scale_format=scale_format, name=name, check_finite=check_finite
    )
    if out is None:
        return q
    out.codes.copy_(q.codes)
    out.scale.copy_(q.scale)
    return out


def per_column_group_quant(
    x: Tensor, *, scale_format: ScaleFormat = "fp32", name: str = "x", check_finite: bool = True
) -> QuantizedTensor:
    """Quantize ``x [M, K]`` with one scale per 128 rows per column (128×1, WGrad's operand).

    Returns ``QuantizedTensor(codes [M, K], scale [ceil(M/128), K], (128,1))``; the codes are a
    transposed view of K-major storage, so ``.t()`` is the contiguous 1×128 operand of
    ``fp8_gemm`` (contraction over tokens). Errors as ``per_token_group_quant``.
    """
    _check_scale_format(scale_format)
    _check_input(x, name, dims=2)
    if _use_triton(x):
        from fp8rl.kernels import quant_triton

        q = quant_triton.per_column_group_quant_triton(x, scale_format=scale_format)
        if should_check_finite(check_finite, x.device):
            raise_if_not_finite(q.scale, name=name, what="a 128x1 column group")
        return q
    return per_column_group_quant_reference(
        x, scale_format=scale_format, name=name, check_finite=check_finite
    )


def per_token_and_column_group_quant(
    x: Tensor, *, scale_format: ScaleFormat = "fp32", name: str = "x", check_finite: bool = True
) -> tuple[QuantizedTensor, QuantizedTensor]:
    """Both quantizations of an output gradient ``x [M, N]``: 1×128 rows and 128×1 columns.

    Returns ``(per_token_group_quant(x), per_column_group_quant(x))`` — bitwise those — with one
    finiteness check (one host sync on CUDA) for both: a NaN/inf poisons a row group exactly when
    it poisons a column group. DGrad needs the rows, WGrad the columns (DESIGN.md §2). (A fused
    single-read Triton kernel over 128×128 tiles was measured slower on the H200 than the two
    kernels: 275 µs vs 160 µs at 16384×4096.)
    Raises ``ValueError`` like ``per_token_group_quant`` (the message names a 1×128 row group).
    """
    _check_scale_format(scale_format)
    _check_input(x, name, dims=2)
    if _use_triton(x):
        from fp8rl.kernels import quant_triton

        rows = quant_triton.per_token_group_quant_triton(x, scale_format=scale_format)
        if should_check_finite(check_finite, x.device):
            raise_if_not_finite(rows.scale, name=name, what="a 1x128 row group")
        return rows, quant_triton.per_column_group_quant_triton(x, scale_format=scale_format)
    rows = per_token_group_quant_reference(
        x, scale_format=scale_format, name=name, check_finite=check_finite
    )
    return rows, per_column_group_quant_reference(x, scale_format=scale_format, check_finite=False)


def requant_to_column_groups(
    q: QuantizedTensor, *, scale_format: ScaleFormat = "fp32", name: str = "x"
) -> QuantizedTensor:
    """Re-quantize a saved 1×128 FP8 activation ``[..., K]`` into 128×1 column groups ``[M, K]``.

    Jet-RL method step 4: the activation is saved in FP8 for the backward pass; WGrad needs it
    grouped along tokens, so it is dequantized (float32, ``codes * scale``) and quantized again
    with 128-token column groups. Leading dims are flattened into M. Returns block (128,1),
    scale ``[ceil(M/128), K]``. Raises ``ValueError`` when ``q`` is not a (1,128) tensor.
    No finiteness check (and no sync): finite E4M3 codes (|c| ≤ 448) times finite scales
    (≤ FLT_MAX/448 by construction) cannot overflow.
    """
    _check_scale_format(scale_format)
    flat = _flatten_row_groups(q, name)
    if _use_triton(flat.codes):
        from fp8rl.kernels import quant_triton

        return quant_triton.requant_to_column_groups_triton(flat, scale_format=scale_format)
    return requant_to_column_groups_reference(flat, scale_format=scale_format, name=name)
