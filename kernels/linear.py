"""FP8Linear: a linear layer that runs the Jet-RL unified precision flow (DESIGN.md §2).

Design notes
------------
* **One forward for everyone.** ``fp8_linear`` (rollout engines, the reference worker, the vLLM
  plugin) and ``FP8Linear.forward`` (the trainer) both call ``_fprop``: quantize X 1×128, one
  ``fp8_gemm`` against the 128×128 weight, add the bias in the output dtype. Same x, same weight
  → bitwise the same y; that is how the rollout graph is a subgraph of the training graph.
* **The weight is quantized once per optimizer step.** ``quantized_weight()`` caches the 128×128
  quantization of the master weight keyed on the parameter's identity, storage and autograd
  version counter (in-place optimizer updates bump it). Exactly these codes + scales feed the
  trainer's forward *and* get shipped to rollout engines; a receiver never re-quantizes a
  differently rounded copy (the BF16-rounded shipping bug that made KL jump 25×).
  Writing through ``weight.data`` does not bump the version: call ``invalidate_quantized()``.
* **Backward** (autograd.Function): X is saved as FP8 codes + 1×128 scales, never in BF16.
  DGrad ``∇X = ∇Y·W`` quantizes ∇Y 1×128 along the output features and reuses the forward's
  weight blocks transposed. WGrad ``∇W = ∇Yᵀ·X`` quantizes ∇Y with 128×1 groups (1×128 along
  tokens, the contraction) and re-quantizes the saved FP8 X into 128×1 groups (Jet-RL step 4).
  ∇W is accumulated in float32 and returned in the weight's dtype; ∇X in x's dtype; the bias
  gradient is the float32 sum of ∇Y over tokens.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from fp8rl.kernels.finite import raise_if_not_finite, should_check_finite
from fp8rl.kernels.gemm import fp8_gemm, fp8_gemm_dequantized
from fp8rl.kernels.quant import (
    FP8_DTYPE,
    GROUP,
    QuantizedTensor,
    ScaleFormat,
    per_block_quant,
    per_token_and_column_group_quant,
    per_token_group_quant,
    requant_to_column_groups,
    scale_grid_shape,
)


def _check_weight(weight: QuantizedTensor, in_features: int | None = None) -> None:
    if not isinstance(weight, QuantizedTensor):
        raise ValueError(f"weight must be a QuantizedTensor, got {type(weight).__name__}")
    if weight.block != (GROUP, GROUP) or weight.codes.dim() != 2:
        raise ValueError(
            f"weight must be a 2-D 128x128-block QuantizedTensor, got block {weight.block} and "
            f"shape {tuple(weight.shape)}"
        )
    if in_features is not None and weight.shape[1] != in_features:
        raise ValueError(
            f"input has {in_features} features but the weight is {tuple(weight.shape)} ([N, K])"
        )


def _own_storage(t: Tensor) -> Tensor:
    """``t`` contiguous in a storage of its own: a row view of a larger buffer (a grouped
    weight, ``linear_group``) is copied, so the module neither keeps nor saves the rest."""
    t = t.contiguous()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


def _fprop(
    x: Tensor,
    weight: QuantizedTensor,
    bias: Tensor | None,
    *,
    exact: bool,
    scale_format: ScaleFormat,
    check_finite: bool = True,
) -> tuple[Tensor, QuantizedTensor]:
    """The one FP8 forward: ``y = quant_1x128(x) · weightᵀ (+ bias)`` in x.dtype, and x's codes."""
    xq = per_token_group_quant(
        x, scale_format=scale_format, name="linear input", check_finite=check_finite
    )
    y = fp8_gemm(xq, weight, out_dtype=x.dtype, exact=exact)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y, xq


def _decode_prologue(x: Tensor, weight: QuantizedTensor) -> bool:
    """True when the fast path quantizes x inside the decode GEMM: CUDA + Triton and a shape the
    tuned table measured faster that way than quantize + GEMM (``prologue_wins``)."""
    from fp8rl.kernels.backend import triton_available

    if not (x.is_cuda and triton_available()) or x.dtype not in (torch.bfloat16, torch.float32):
        return False
    from fp8rl.kernels.gemm_decode_triton import prologue_wins

    rows = x.numel() // max(x.shape[-1], 1)
    n, k = weight.shape
    return weight.codes.stride(-1) == 1 and prologue_wins(rows, n, k)


def _fprop_decode(
    x: Tensor,
    weight: QuantizedTensor,
    bias: Tensor | None,
    scale_format: ScaleFormat,
    check_finite: bool,
) -> Tensor:
    """The fast inference FProp at decode sizes: 1×128 quant fused into the GEMM prologue
    (same codes as ``per_token_group_quant``; the scales it returns feed the finiteness check)."""
    from fp8rl.kernels.gemm_decode_triton import fp8_gemm_decode

    x2 = x.reshape(-1, x.shape[-1])
    y, scales = fp8_gemm_decode(x2, weight, out_dtype=x.dtype, scale_format=scale_format)
    if should_check_finite(check_finite, x.device):
        raise_if_not_finite(scales, name="linear input", what="a 1x128 row group")
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def fp8_linear(
    x: Tensor,
    weight: QuantizedTensor,
    bias: Tensor | None = None,
    *,
    exact: bool = False,
    scale_format: ScaleFormat = "fp32",
    check_finite: bool = True,
) -> Tensor:
    """Inference FProp ``y[..., N] = quant_1x128(x) · weightᵀ + bias`` (no autograd).

    Args:
        x: ``[..., K]`` float32/bfloat16 activations (quantized 1×128 here).
        weight: ``[N, K]`` 128×128-block ``QuantizedTensor`` (``FP8Linear.quantized_weight()`` or
            a received weight update).
        bias: optional ``[N]``; added in the output dtype.
        exact: batch-invariant kernels (bitwise parity mode).
        scale_format: the activation scale rule (must match the trainer's QuantConfig).
        check_finite: raise on NaN/inf in ``x``. On CUDA this costs one host sync per call
            (none inside ``deferred_finite_checks()``, which raises at the block's end; skipped
            inside CUDA-graph capture); it never changes the result's bits.
    Returns:
        ``[..., N]`` in ``x.dtype``, bitwise equal to ``FP8Linear.forward`` for the same inputs.
    Raises:
        ValueError: wrong weight granularity, feature mismatch, NaN/inf in ``x``.
    Source: Jet-RL (arXiv 2601.14243) unified FP8 FProp; DeepSeek-V3 §3.3 granularity.
    """
    _check_weight(weight, x.shape[-1])
    with torch.no_grad():
        if not exact and _decode_prologue(x, weight):
            return _fprop_decode(x, weight, bias, scale_format, check_finite)
        return _fprop(
            x, weight, bias, exact=exact, scale_format=scale_format, check_finite=check_finite
        )[0]


def _backward_gemm(a: QuantizedTensor, b: QuantizedTensor, *, out_dtype: torch.dtype) -> Tensor:
    """DGrad/WGrad GEMM: the device's fast FP8 kernel on CUDA, in both modes; on CPU the
    dequantized float32 GEMM. The backward needs no batch invariance, only the forward does: the
    rollout scores tokens with a forward, so exact mode's parity is the FProp's. (Before
    2026-12-05 exact mode ran DGrad and WGrad on its batch-invariant Triton GEMM too: 277 ms of
    FP8 GEMMs in a 16K-token 8-layer Llama-3.1-8B step on an H200, against 152 ms in fast mode.)
    Deterministic either way: fixed kernels, no atomics."""
    if a.codes.device.type == "cuda":
        return fp8_gemm(a, b, out_dtype=out_dtype)
    return fp8_gemm_dequantized(a, b, out_dtype=out_dtype)


class FP8LinearFunction(torch.autograd.Function):
    """FProp / DGrad / WGrad of DESIGN.md §2 with the activation saved in FP8.

    ``FP8LinearFunction.apply(x, weight, bias, w_codes, w_scale, exact, scale_format,
    check_finite)``: ``x [..., K]``, master ``weight [N, K]`` (only its dtype and gradient slot are
    used), optional ``bias [N]``, and the weight's 128×128 quantization (``w_codes`` E4M3
    ``[N, K]``, ``w_scale`` float32 ``[ceil(N/128), ceil(K/128)]``). Returns ``[..., N]`` in
    ``x.dtype``. Public so parallel layers (Megatron's Column/RowParallelLinear) run the same
    FProp/DGrad/WGrad on their local shard as ``FP8Linear``.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, w_codes, w_scale, exact, scale_format, check_finite):
        wq = QuantizedTensor(w_codes, w_scale, (GROUP, GROUP))
        w_dtype = None if weight is None else weight.dtype  # None: a from_quantized module
        return _save_fprop(ctx, x, w_dtype, bias, wq, exact, scale_format, check_finite)

    @staticmethod
    def backward(ctx, grad_y):
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_x, grad_w, grad_2d = _fp8_backward(ctx, grad_y, need_x, need_w)
        grad_b = None
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = grad_2d.to(torch.float32).sum(dim=0).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None


def _fp8_backward(
    ctx, grad_y: Tensor, need_x: bool, need_w: bool
) -> tuple[Tensor | None, Tensor | None, Tensor]:
    """DGrad and WGrad of an FP8 FProp saved by ``_save_fprop``: ``(∇X or None, ∇W or None,
    ∇Y as 2-D)``. ∇Y is quantized once into 1×128 rows (DGrad, along N) and 128×1 columns
    (WGrad, along tokens); the saved FP8 X is re-quantized into 128×1 groups (Jet-RL step 4)."""
    x_codes, x_scale, w_codes, w_scale = ctx.saved_tensors
    scale_format = ctx.scale_format
    grad_2d = grad_y.reshape(-1, grad_y.shape[-1])
    grad_x = grad_w = None
    if need_x or need_w:  # ∇Y read once: 1×128 rows (DGrad) and 128×1 columns (WGrad)
        g_rows, g_cols = per_token_and_column_group_quant(
            grad_2d, scale_format=scale_format, name="grad_output", check_finite=ctx.check_finite
        )
    if need_x:  # DGrad: ∇Y (1×128 along N) · the same W blocks transposed
        wq = QuantizedTensor(w_codes, w_scale, (GROUP, GROUP))
        grad_x = _backward_gemm(g_rows, wq.t(), out_dtype=ctx.x_dtype)
        grad_x = grad_x.reshape(ctx.x_shape)
    if need_w:  # WGrad: ∇Yᵀ (1×128 along tokens) · X (128×1 re-quantized from FP8 X)
        xq = QuantizedTensor(x_codes, x_scale, (1, GROUP))
        x_cols = requant_to_column_groups(xq, scale_format=scale_format, name="saved input")
        direct = ctx.w_dtype in (torch.float32, torch.bfloat16)  # fp32 accumulate, one rounding
        out_dtype = ctx.w_dtype if direct else torch.float32
        grad_w = _backward_gemm(g_cols.t(), x_cols.t(), out_dtype=out_dtype)
        grad_w = grad_w.to(ctx.w_dtype)
    return grad_x, grad_w, grad_2d


def _save_fprop(ctx, x, w_dtype, bias, wq, exact, scale_format, check_finite) -> Tensor:
    """``_fprop`` with what ``_fp8_backward`` needs saved on ``ctx`` (X in FP8, never BF16)."""
    y, xq = _fprop(x, wq, bias, exact=exact, scale_format=scale_format, check_finite=check_finite)
    ctx.save_for_backward(xq.codes, xq.scale, wq.codes, wq.scale)
    ctx.scale_format, ctx.check_finite = scale_format, check_finite
    ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, w_dtype
    ctx.bias_dtype = None if bias is None else bias.dtype
    return y


class FP8Linear(nn.Module):
    """``nn.Linear`` replacement running the unified FP8 precision flow (Jet-RL, DESIGN.md §2).

    Args:
        in_features: K. out_features: N. bias: whether to learn an additive bias ``[N]``.
        scale_format: ``"fp32"`` or ``"pow2"`` scale rule (the QuantConfig's ``scale_format``).
        exact: batch-invariant kernels (``precision.exact``).
        check_finite: raise on NaN/inf activations/gradients (one host sync per quantization on
            CUDA; never changes results). Attribute, may be switched off for eager decoding.
        device, dtype: of the master weight (float32 or bfloat16).
    Attributes:
        weight: master weight ``[N, K]`` (trainable), ``None`` for ``from_quantized`` modules,
            which hold the buffers ``weight_codes`` (E4M3 ``[N, K]``) and ``weight_scale``
            (float32 ``[ceil(N/128), ceil(K/128)]``) instead.
    Forward: ``x [..., K] → y [..., N]`` in ``x.dtype``, bitwise equal to
    ``fp8_linear(x, self.quantized_weight(), self.bias)``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        scale_format: ScaleFormat = "fp32",
        exact: bool = False,
        check_finite: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if scale_format not in ("fp32", "pow2"):
            raise ValueError(f"scale_format must be 'fp32' or 'pow2', got {scale_format!r}")
        self.in_features, self.out_features = in_features, out_features
        self.scale_format, self.exact, self.check_finite = scale_format, exact, check_finite
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self._cached: QuantizedTensor | None = None
        self._cache_key: tuple | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s initialisation (Kaiming-uniform weight, uniform bias)."""
        if self.weight is None:
            raise ValueError("reset_parameters: a from_quantized FP8Linear has no master weight")
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)
        self.invalidate_quantized()

    def _key(self) -> tuple:
        w = self.weight
        return (id(w), w.data_ptr(), w.device, w.dtype, w._version, self.scale_format)

    def quantized_weight(self) -> QuantizedTensor:
        """The 128×128 FP8 quantization of the current weight (cached until the weight changes).

        Recomputed when the parameter object, its storage or its version counter changed (an
        optimizer step) or after ``invalidate_quantized()``. These codes + scales are what the
        forward uses and what a WeightUpdate ships.
        """
        if self.weight is None:
            return QuantizedTensor(self.weight_codes, self.weight_scale, (GROUP, GROUP))
        key = self._key()
        if self._cached is None or key != self._cache_key:
            with torch.no_grad():
                self._cached = per_block_quant(
                    self.weight.detach(), scale_format=self.scale_format, name="FP8Linear.weight"
                )
            self._cache_key = key
        return self._cached

    def invalidate_quantized(self) -> None:
        """Drop the cached weight quantization (needed after writes through ``weight.data``)."""
        self._cached, self._cache_key = None, None

    @classmethod
    def from_quantized(
        cls,
        weight: QuantizedTensor,
        bias: Tensor | None = None,
        *,
        scale_format: ScaleFormat = "fp32",
        exact: bool = False,
        check_finite: bool = True,
    ) -> FP8Linear:
        """An inference-only FP8Linear holding ``weight``'s codes + scales as buffers.

        No master weight, nothing requires grad; forward == ``fp8_linear(x, weight, bias)``.
        The buffers are ``weight.codes`` / ``weight.scale`` made contiguous in storages of their
        own (no copy when they already are). Raises ``ValueError`` for a weight that is not 2-D 128×128-block.
        """
        _check_weight(weight)
        if scale_format not in ("fp32", "pow2"):
            raise ValueError(f"scale_format must be 'fp32' or 'pow2', got {scale_format!r}")
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.out_features, module.in_features = weight.shape
        module.scale_format, module.exact, module.check_finite = scale_format, exact, check_finite
        module._cached, module._cache_key = None, None
        module.register_parameter("weight", None)
        module.register_buffer("weight_codes", _own_storage(weight.codes))
        module.register_buffer("weight_scale", _own_storage(weight.scale))
        module.register_buffer("bias", None if bias is None else bias.detach())
        return module

    def load_quantized(self, weight: QuantizedTensor) -> None:
        """Replace the codes + scales of a ``from_quantized`` module in place (no reallocation).

        Raises ``ValueError`` naming the mismatch when block, shape or dtype differ, or when the
        module has a master weight (a trainable FP8Linear quantizes its own weight).
        """
        if self.weight is not None:
            raise ValueError(
                "load_quantized: this FP8Linear has a master weight and quantizes it itself; "
                "only modules built with FP8Linear.from_quantized load codes + scales"
            )
        _check_weight(weight)
        expected = {
            "codes": (tuple(self.weight_codes.shape), FP8_DTYPE),
            "scale": (
                scale_grid_shape(tuple(self.weight_codes.shape), (GROUP, GROUP)),
                torch.float32,
            ),
        }
        for field, (shape, dtype) in expected.items():
            got = getattr(weight, field)
            if tuple(got.shape) != shape or got.dtype != dtype:
                raise ValueError(
                    f"load_quantized: weight.{field} is {tuple(got.shape)} {got.dtype}, this "
                    f"layer needs {shape} {dtype}"
                )
        with torch.no_grad():
            self.weight_codes.copy_(weight.codes)
            self.weight_scale.copy_(weight.scale)

    def forward(self, x: Tensor) -> Tensor:
        """``x [..., K]`` → ``[..., N]`` in ``x.dtype`` (FProp 1×128 X · 128×128 W)."""
        wq = self.quantized_weight()
        params_need_grad = self.weight is not None and (
            self.weight.requires_grad or (self.bias is not None and self.bias.requires_grad)
        )
        if not torch.is_grad_enabled() or not (x.requires_grad or params_need_grad):
            return fp8_linear(
                x,
                wq,
                self.bias,
                exact=self.exact,
                scale_format=self.scale_format,
                check_finite=self.check_finite,
            )
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"input has {x.shape[-1]} features, FP8Linear expects {self.in_features}"
            )
        return FP8LinearFunction.apply(
            x,
            self.weight,
            self.bias,
            wq.codes,
            wq.scale,
            self.exact,
            self.scale_format,
            self.check_finite,
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, scale_format={self.scale_format}, exact={self.exact}"
        )
