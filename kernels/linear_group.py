"""Sibling FP8 linears that read the same input (q/k/v, gate/up) as one FP8 GEMM per pass.

Design notes
------------
* **Why.** The trainer's q/k/v and gate/up are separate ``FP8Linear`` modules (Hugging Face
  parameter names, per-parameter weight updates). Called one by one, each quantizes the same X
  1×128, runs its own GEMMs in forward and backward and re-quantizes the saved X into 128×1
  groups: three (two) times the quantizer work and the host time of the launches. At small
  micro-batches the eager FP8 step is bound by that host time (H200, 8 Llama-3.1-8B layers,
  2K tokens: 0.148 s FP8 vs 0.103 s BF16 for the same ~98 ms of kernels).
* **What.** ``grouped_fp8_linear`` runs them as one FProp, one DGrad and one WGrad over the
  ``[ΣN, K]`` weight, then splits the output (views along the last dim) and ∇W (row blocks).
  The rollout engines already run the fused weight (``workers.model.fusion``), so the trainer's
  FProp is now the very GEMM the engine runs: same operands, same kernel choice for the shape.
* **No extra weight memory.** The 128×128 quantization of ``cat(W_i)`` equals the
  concatenation of the per-module quantizations bitwise when every N is a multiple of 128 (the
  blocks do not straddle modules). The group quantizes each master weight straight into its
  rows of one ``[ΣN, K]`` buffer once per weight version and makes each module's cached
  ``quantized_weight()`` that row view, so what a weight update ships is unchanged and nothing
  is stored twice. A sub-list of a group (a prefix, another order) gets its own buffer.
* **When.** Fast mode, grad enabled or not, every module a trainable ``FP8Linear`` (not a
  subclass that overrides ``forward``, no forward hooks on it) with the same K, dtype, device,
  scale format and checks, N a multiple of 128, biases all present or all absent. Otherwise
  (exact mode, dense layers, ragged N, ...) each module runs on its own, as before: exact mode
  keeps per-module calls on both sides, so its parity contract is untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fp8rl.kernels.linear import FP8Linear, _fp8_backward, _save_fprop, fp8_linear
from fp8rl.kernels.quant import FP8_DTYPE, GROUP, QuantizedTensor, per_block_quant

_ENABLED = [True]


def set_grouped(on: bool) -> bool:
    """Switch the grouped path on or off process-wide (on by default; off is the per-module
    path before it, the baseline of ``benchmarks/train_step.py --grouped``); returns the
    previous setting."""
    previous, _ENABLED[0] = _ENABLED[0], bool(on)
    return previous


class FP8GroupedLinearFunction(torch.autograd.Function):
    """FProp / DGrad / WGrad of sibling FP8 linears over their concatenated weight.

    ``apply(x, bias, w_codes, w_scale, exact, scale_format, check_finite, *weights)``: ``x
    [..., K]``, the concatenated bias ``[ΣN]`` or None, the ``[ΣN, K]`` 128×128 quantization,
    and the master weights ``[N_i, K]`` (their dtype and gradient slots). Returns ``[..., ΣN]``
    in x.dtype; backward returns ∇W split into the modules' row blocks.
    """

    @staticmethod
    def forward(ctx, x, bias, w_codes, w_scale, exact, scale_format, check_finite, *weights):
        wq = QuantizedTensor(w_codes, w_scale, (GROUP, GROUP))
        ctx.rows = [w.shape[0] for w in weights]
        return _save_fprop(ctx, x, weights[0].dtype, bias, wq, exact, scale_format, check_finite)

    @staticmethod
    def backward(ctx, grad_y):
        need_x, need_w = ctx.needs_input_grad[0], any(ctx.needs_input_grad[7:])
        grad_x, grad_w, grad_2d = _fp8_backward(ctx, grad_y, need_x, need_w)
        grad_b = None
        if ctx.bias_dtype is not None and ctx.needs_input_grad[1]:
            grad_b = grad_2d.to(torch.float32).sum(dim=0).to(ctx.bias_dtype)
        grads_w = grad_w.split(ctx.rows) if grad_w is not None else [None] * len(ctx.rows)
        return (grad_x, grad_b, None, None, None, None, None, *grads_w)


def groupable(layers: Sequence[nn.Module]) -> bool:
    """Whether ``grouped_fp8_linear`` runs ``layers`` as one GEMM (see the module notes)."""
    first = layers[0] if layers else None
    if not _ENABLED[0] or not isinstance(first, FP8Linear) or first.weight is None or first.exact:
        return False
    with_bias = first.bias is not None
    return all(
        isinstance(m, FP8Linear)
        and type(m).forward is FP8Linear.forward  # a subclass or a hook changes what m(x) is
        and not (m._forward_hooks or m._forward_pre_hooks)
        and m.weight is not None
        and not m.exact
        and m.out_features % GROUP == 0
        and m.in_features == first.in_features
        and m.weight.dtype == first.weight.dtype
        and m.weight.device == first.weight.device
        and (m.scale_format, m.check_finite) == (first.scale_format, first.check_finite)
        and (m.bias is not None) == with_bias
        for m in layers
    )


def _views_of(fused: QuantizedTensor, layers: Sequence[FP8Linear]) -> bool:
    """Whether every layer's valid cached quantization is its row view of ``fused``, and the
    layers cover all of ``fused`` (a prefix of a larger group does not)."""
    if fused.codes.shape[0] != sum(m.out_features for m in layers):
        return False
    row = 0
    for m in layers:
        cached = m._cached
        if cached is None or m._cache_key != m._key():
            return False
        if cached.codes.data_ptr() != fused.codes.data_ptr() + row * fused.codes.stride(0):
            return False
        row += m.out_features
    return True


def group_quantized_weight(layers: Sequence[FP8Linear]) -> QuantizedTensor:
    """The ``[ΣN, K]`` 128×128 quantization of the layers' concatenated master weights.

    Reused while every layer's cached ``quantized_weight()`` is still its row view (same weight
    versions); otherwise each weight is quantized straight into its rows of a new buffer (no
    concatenated copy of the master weights) and the views re-installed. Bitwise the
    concatenation of the per-layer quantizations (N multiples of 128; ``groupable``).
    """
    fused = getattr(layers[0], "_group_weight", None)
    if fused is not None and _views_of(fused, layers):
        return fused
    first = layers[0].weight
    rows, k = sum(m.out_features for m in layers), first.shape[1]
    fused = QuantizedTensor(
        torch.empty(rows, k, dtype=FP8_DTYPE, device=first.device),
        torch.empty(rows // GROUP, -(-k // GROUP), dtype=torch.float32, device=first.device),
        (GROUP, GROUP),
    )
    row = 0
    with torch.no_grad():
        for m in layers:
            n = m.out_features
            view = QuantizedTensor(
                fused.codes[row : row + n],
                fused.scale[row // GROUP : (row + n) // GROUP],
                fused.block,
            )
            per_block_quant(
                m.weight.detach(), scale_format=m.scale_format, name="FP8Linear.weight", out=view
            )
            m._cached, m._cache_key = view, m._key()
            row += n
    layers[0]._group_weight = fused
    return fused


def grouped_fp8_linear(x: Tensor, layers: Sequence[nn.Module]) -> list[Tensor]:
    """``[layer(x) for layer in layers]``, as one FP8 GEMM per pass when ``groupable(layers)``.

    Args:
        x: ``[..., K]`` activations read by every layer.
        layers: sibling linears (``FP8Linear`` or any module; see ``groupable``).
    Returns:
        One ``[..., N_i]`` tensor per layer in x.dtype: views of the ``[..., ΣN]`` product when
        grouped (bitwise the per-layer forwards' values, with the same gradients up to
        float32 summation order in DGrad), else each layer's own output.
    Raises:
        ValueError: x's last dim is not the layers' K.
    Source: Megatron-LM's fused ``linear_qkv`` / ``linear_fc1``; Jet-RL unified FP8 flow.
    """
    if not groupable(layers):
        return [layer(x) for layer in layers]
    first = layers[0]
    if x.shape[-1] != first.in_features:
        raise ValueError(f"input has {x.shape[-1]} features, the layers expect {first.in_features}")
    wq = group_quantized_weight(layers)
    bias = torch.cat([m.bias for m in layers]) if first.bias is not None else None
    flags = (first.exact, first.scale_format, first.check_finite)
    weights = [m.weight for m in layers]
    needs_grad = x.requires_grad or any(w.requires_grad for w in weights)
    if torch.is_grad_enabled() and (needs_grad or (bias is not None and bias.requires_grad)):
        y = FP8GroupedLinearFunction.apply(x, bias, wq.codes, wq.scale, *flags, *weights)
    else:
        y = fp8_linear(x, wq, bias, exact=flags[0], scale_format=flags[1], check_finite=flags[2])
    return list(y.split([m.out_features for m in layers], dim=-1))
