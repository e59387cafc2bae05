"""Sibling FP8 linears (q/k/v, gate/up) as one GEMM per pass: kernels.linear_group (CPU)."""

import pytest
import torch

from fp8rl.kernels import FP8Linear, grouped_fp8_linear, per_block_quant
from fp8rl.kernels.linear_group import groupable, set_grouped


def _siblings(sizes=(256, 128, 128), k=256, bias=False, **kw):
    torch.manual_seed(0)
    return [FP8Linear(k, n, bias=bias, **kw) for n in sizes]


@pytest.mark.parametrize("bias", [False, True])
def test_grouped_forward_is_bitwise_the_per_module_forward_and_gradients_match(bias):
    layers = _siblings(bias=bias)
    x = torch.randn(2, 5, 256, requires_grad=True)
    grouped = grouped_fp8_linear(x, layers)
    alone = [layer(x) for layer in layers]
    assert all(torch.equal(a, b) for a, b in zip(grouped, alone, strict=True))
    grads = [torch.randn_like(y) for y in grouped]
    params = [x] + [p for layer in layers for p in layer.parameters()]
    got = torch.autograd.grad(grouped, params, grads)
    want = torch.autograd.grad(alone, params, grads)
    # ∇X sums over ΣN in one GEMM instead of three: float32 order only; ∇W and ∇b per row
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(got[1:], want[1:], strict=True))


def test_each_modules_quantized_weight_is_a_view_of_one_buffer_and_follows_updates():
    layers = _siblings()
    x = torch.randn(3, 256)
    grouped_fp8_linear(x, layers)
    views = [layer.quantized_weight() for layer in layers]
    base = views[0].codes.data_ptr()
    assert [v.codes.data_ptr() - base for v in views] == [0, 256 * 256, 384 * 256]
    for layer, view in zip(layers, views, strict=True):  # what a weight update ships
        fresh = per_block_quant(layer.weight.detach())
        assert torch.equal(view.codes.view(torch.uint8), fresh.codes.view(torch.uint8))
        assert torch.equal(view.scale, fresh.scale)
    with torch.no_grad():
        layers[1].weight.mul_(2.0)  # an optimizer step bumps the version: re-quantized
    y = grouped_fp8_linear(x, layers)[1]
    assert torch.equal(y, layers[1](x))
    assert not torch.equal(layers[1].quantized_weight().scale, views[1].scale)


@pytest.mark.parametrize(
    "case", ["exact", "ragged", "switched off", "mixed scale format", "hooked", "subclass"]
)
def test_layers_that_cannot_share_a_gemm_run_one_by_one(case):
    if case == "exact":
        layers = _siblings(exact=True)
    elif case == "ragged":
        layers = _siblings(sizes=(256, 100))
    else:
        layers = _siblings()
    if case == "mixed scale format":
        layers[1].scale_format = "pow2"
    if case == "hooked":
        layers[1].register_forward_hook(lambda module, args, out: out * 2)
    if case == "subclass":

        class Halved(FP8Linear):
            def forward(self, x):
                return super().forward(x) * 0.5

        layers[2] = Halved(256, 128, bias=False)
    previous = set_grouped(case != "switched off")
    try:
        assert not groupable(layers)
        x = torch.randn(4, 256)
        for got, layer in zip(grouped_fp8_linear(x, layers), layers, strict=True):
            assert torch.equal(got, layer(x))
    finally:
        set_grouped(previous)


def test_wrong_input_width_names_the_features():
    with pytest.raises(ValueError, match="input has 128 features, the layers expect 256"):
        grouped_fp8_linear(torch.randn(2, 128), _siblings())


def test_a_sub_list_of_a_group_gets_its_own_buffer():
    layers = _siblings()
    x = torch.randn(4, 256)
    for group in (layers, layers[:2], [layers[0]], layers, [layers[2], layers[1]], layers[:2]):
        for got, layer in zip(grouped_fp8_linear(x, group), group, strict=True):
            assert torch.equal(got, layer(x))


def test_empty_input_gives_empty_outputs_and_zero_weight_gradients():
    layers = _siblings()
    x = torch.randn(2, 0, 256, requires_grad=True)
    outs = grouped_fp8_linear(x, layers)
    assert [tuple(y.shape) for y in outs] == [(2, 0, 256), (2, 0, 128), (2, 0, 128)]
    sum(y.sum() for y in outs).backward()
    assert x.grad.shape == x.shape and all(not layer.weight.grad.any() for layer in layers)


def test_a_layer_frozen_from_a_group_owns_only_its_rows():
    layers = _siblings()
    grouped_fp8_linear(torch.randn(3, 256), layers)
    frozen = FP8Linear.from_quantized(layers[1].quantized_weight())
    assert frozen.weight_codes.untyped_storage().nbytes() == 128 * 256
    x = torch.randn(3, 256)
    assert torch.equal(frozen(x), layers[1](x))
