"""Per-layer precision: which linear layers run FP8 GEMMs and which stay dense (BF16/FP32).

``make_linear`` is the single switch point between the precision modes (DESIGN.md §3): the same
decoder code builds a BF16 model, an FP8 trainer (``FP8Linear`` with master weights) or an FP8
inference model (``FP8Linear.from_quantized``-style buffers, filled by weight sync).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from fp8rl.kernels.invariant import dense_linear
from fp8rl.protocol import QuantConfig


@dataclass(frozen=True)
class LayerPrecision:
    """Precision of one model instance (or of one block, after ``for_block``).

    Attributes:
        dtype: compute dtype of activations (bfloat16 or float32).
        fp8: linear layers run FP8 GEMMs (except the BF16-kept modules).
        quant: the QuantConfig (scale rule, BF16-kept modules and blocks); required when fp8.
        exact: batch-invariant (bitwise parity) kernels.
        trainable: linear layers own master weights (trainer) instead of FP8 codes only (engines).
        kv_fp8: keys/values go through the calibrated per-tensor FP8 round trip (FP8 KV cache);
            a model-level switch that BF16-kept blocks keep too.
    """

    dtype: torch.dtype = torch.bfloat16
    fp8: bool = False
    quant: QuantConfig | None = None
    exact: bool = False
    trainable: bool = True
    kv_fp8: bool = False

    def __post_init__(self) -> None:
        if self.fp8 and self.quant is None:
            raise ValueError("an FP8 LayerPrecision needs a QuantConfig")

    def for_block(self, index: int, num_blocks: int) -> LayerPrecision:
        """The precision of decoder block ``index``: dense when the QuantConfig keeps it in BF16."""
        if not self.fp8:
            return self
        q = self.quant
        if index < q.bf16_first_blocks or index >= num_blocks - q.bf16_last_blocks:
            return replace(self, fp8=False)
        return self

    def linear_is_fp8(self, name: str, num_blocks: int) -> bool:
        """Whether linear module ``name`` runs FP8 under this (model-level) precision."""
        parts = name.split(".")
        precision = self
        if len(parts) > 2 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
            precision = self.for_block(int(parts[2]), num_blocks)
        return not precision.keeps_dense(name)

    def keeps_dense(self, name: str) -> bool:
        """True when module ``name`` (e.g. ``model.layers.0.mlp.down_proj``) stays dense."""
        if not self.fp8:
            return True
        parts = name.split(".")
        return any(parts[-len(p.split(".")) :] == p.split(".") for p in self.quant.bf16_modules)


class DenseLinear(nn.Module):
    """A linear layer kept in BF16/FP32: y = x·Wᵀ + b through ``kernels.invariant.dense_linear``.

    The weight may be an FP32 master copy; it is cast to the activation dtype before the GEMM so the
    trainer computes exactly what a rollout engine holding the BF16 copy computes.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, *, exact: bool) -> None:
        super().__init__()
        self.in_features, self.out_features, self.exact = in_features, out_features, exact
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        return dense_linear(x, self.weight, self.bias, exact=self.exact)


def make_linear(
    name: str, in_features: int, out_features: int, bias: bool, precision: LayerPrecision
) -> nn.Module:
    """The linear layer for module ``name`` under ``precision`` (FP8Linear or DenseLinear).

    Args:
        name: fully qualified module name (checked against the QuantConfig's BF16-kept modules).
        in_features, out_features: K and N of the [N, K] weight.
        bias: whether the layer has a bias.
        precision: the model's (or block's) precision.
    """
    if precision.keeps_dense(name):
        return DenseLinear(in_features, out_features, bias, exact=precision.exact)
    from fp8rl.kernels import FP8Linear

    layer = FP8Linear(
        in_features,
        out_features,
        bias=bias,
        scale_format=precision.quant.scale_format,
        exact=precision.exact,
    )
    nn.init.normal_(layer.weight, std=0.02)
    return layer
