"""Megatron Column/RowParallelLinear running fp8rl's linear math on the local TP shard.

``_forward_impl`` is the hook: Megatron's ``forward`` keeps its TP communication (output gather,
row-parallel all-reduce / reduce-scatter) and calls ``_forward_impl`` for the local GEMM. Here it
runs, per *native part* of the shard, exactly the op the native decoder runs for that HF tensor:

* FP8 (``unified_fp8``): ``FP8LinearFunction`` (1×128 E4M3 activations, 128×128 E4M3 weight
  blocks, FP8 DGrad/WGrad) with the part's own 128×128 quantization, cached per weight version;
* dense (``bf16`` / ``fp8_rollout`` trainer, BF16-kept modules): ``kernels.invariant.dense_linear``.

Native parts: the fused QKV shard is de-interleaved to ``[q; k; v]`` rows (``convert.
qkv_native_order``) and ``fc1`` is ``[gate; up]``; each part is quantized as the native trainer
quantizes its (sharded) HF tensor, the part outputs are concatenated and permuted back to
Megatron's layout. Activations are processed in ``[b, s, ·]`` order (the native decoder's), so at
TP 1 the outputs are bitwise the native layers'.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from megatron.core import tensor_parallel
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
)
from torch import Tensor

from fp8rl.kernels import FP8LinearFunction, QuantizedTensor, per_block_quant
from fp8rl.kernels.invariant import dense_linear


@dataclass(frozen=True)
class LinearPlan:
    """How one Megatron linear computes.

    Attributes:
        fp8: FP8 GEMMs (else dense ``dense_linear`` in the activation dtype).
        scale_format: the QuantConfig's scale rule (FP8 only).
        exact: batch-invariant kernels.
        parts: output rows of each native part, in native order (``(rows,)`` for one part).
        order: ``order[j]`` = local (Megatron) row of native-order row ``j``; None = identity.
        check_finite: raise on NaN/inf activations and gradients (FP8 only).
    """

    fp8: bool
    scale_format: str = "fp32"
    exact: bool = False
    parts: tuple[int, ...] = ()
    order: tuple[int, ...] | None = None
    check_finite: bool = True


class _PlannedLinear:
    """Mixin: ``_forward_impl`` per ``LinearPlan`` (set as the class attribute ``plan``)."""

    plan: LinearPlan

    def _quantized_parts(self, weight: Tensor) -> list[QuantizedTensor]:
        """128×128 quantization of each native part of ``weight`` (cached per weight version)."""
        key = (id(weight), weight.data_ptr(), weight._version, weight.dtype)
        if getattr(self, "_fp8_key", None) != key:
            with torch.no_grad():
                self._fp8_parts = [
                    per_block_quant(w, scale_format=self.plan.scale_format, name="megatron weight")
                    for w in self._native_parts(weight.detach())
                ]
            self._fp8_key = key
        return self._fp8_parts

    def invalidate_quantized(self) -> None:
        """Drop the cached quantization (after writes through ``weight.data``)."""
        self._fp8_key = None

    def _native_parts(self, tensor: Tensor | None) -> list[Tensor | None]:
        if tensor is None:
            return [None] * len(self.plan.parts)
        if self.plan.order is not None:
            index = torch.tensor(self.plan.order, device=tensor.device)
            tensor = tensor.index_select(0, index)
        return list(tensor.split(list(self.plan.parts)))

    def _local_gemm(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """``x [s, b, K]`` → ``[s, b, N_local]`` in Megatron's row order, computed in ``[b, s]``
        order part by part."""
        xb = x.transpose(0, 1).contiguous()
        plan = self.plan
        weights, biases = self._native_parts(weight), self._native_parts(bias)
        if plan.fp8:
            outs = [
                FP8LinearFunction.apply(
                    xb, w, b, q.codes, q.scale, plan.exact, plan.scale_format, plan.check_finite
                )
                for w, b, q in zip(weights, biases, self._quantized_parts(weight), strict=True)
            ]
        else:
            outs = [
                dense_linear(xb, w, b, exact=plan.exact)
                for w, b in zip(weights, biases, strict=True)
            ]
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        if plan.order is not None:
            inverse = torch.empty(len(plan.order), dtype=torch.long)
            inverse[torch.tensor(plan.order)] = torch.arange(len(plan.order))
            y = y.index_select(-1, inverse.to(y.device))
        # contiguous: Megatron all-reduces ``input_.contiguous()`` in place (a copy otherwise)
        return y.transpose(0, 1).contiguous()


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous: Megatron's TP all-reduce in
    backward reduces ``grad.contiguous()`` in place, which is a copy (and the reduction is lost)
    when the gradient arrives as a transposed view."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def tp_input(x: Tensor, *, sequence_parallel: bool, allreduce_dgrad: bool, group) -> Tensor:
    """A column-parallel layer's input: gathered from the sequence-parallel region, or copied into
    the TP region (DGrad all-reduced over TP in backward); unchanged at TP 1."""
    if sequence_parallel:
        return gather_from_sequence_parallel_region(x, True, group=group)
    if allreduce_dgrad:
        return _ContiguousGrad.apply(copy_to_tensor_model_parallel_region(x, group=group))
    return x


class PlannedColumnParallelLinear(_PlannedLinear, tensor_parallel.ColumnParallelLinear):
    """ColumnParallelLinear whose local GEMM follows ``plan`` (see the module docstring)."""

    def _forward_impl(self, input, weight, bias=None, *args, **kwargs):
        input = tp_input(
            input,
            sequence_parallel=bool(kwargs.get("sequence_parallel")),
            allreduce_dgrad=bool(kwargs.get("allreduce_dgrad")),
            group=kwargs.get("tp_group"),
        )
        return self._local_gemm(input, weight, bias)


class PlannedRowParallelLinear(_PlannedLinear, tensor_parallel.RowParallelLinear):
    """RowParallelLinear whose local GEMM follows ``plan`` (partial sums reduced by Megatron)."""

    def _forward_impl(self, input, weight, bias=None, *args, **kwargs):
        return self._local_gemm(input, weight, bias)


def planned(base: type, plan: LinearPlan) -> type:
    """A subclass of ``base`` carrying ``plan`` (usable both as a spec module and as a builder
    that Megatron calls directly, as ``SelfAttention`` does for ``linear_qkv``)."""
    return type(f"{base.__name__}[{'fp8' if plan.fp8 else 'dense'}]", (base,), {"plan": plan})
