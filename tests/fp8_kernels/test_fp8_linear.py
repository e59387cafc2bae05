"""CPU tests of FP8Linear / fp8_linear: the Jet-RL precision flow, caching, inference modules."""

from __future__ import annotations

import pytest
import torch

from fp8rl.kernels import (
    FP8_DTYPE,
    FP8Linear,
    fp8_gemm,
    fp8_linear,
    per_block_quant,
    per_column_group_quant,
    per_token_group_quant,
    requant_to_column_groups,
)
from fp8rl.kernels.gemm import fp8_gemm_dequantized

# Documented error bounds (relative Frobenius error against a float64 linear on random normal
# data, measured 0.036 / 0.036 / 0.045 over 5 seeds; BF16 nn.Linear gets ~0.002): E4M3 keeps
# 3 mantissa bits, each operand carries ~2.5 % RMS rounding error; WGrad re-quantizes X twice.
FORWARD_BOUND, DGRAD_BOUND, WGRAD_BOUND = 0.05, 0.05, 0.06


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.detach().double() - ref).norm() / ref.norm())


def _float64_linear(x, weight, bias, grad):
    x64 = x.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    b64 = bias.detach().double().requires_grad_()
    y64 = torch.nn.functional.linear(x64, w64, b64)
    y64.backward(grad.double())
    return y64.detach(), x64.grad, w64.grad, b64.grad


@pytest.mark.parametrize("scale_format", ["fp32", "pow2"])
def test_forward_and_backward_within_documented_bounds_of_float64_linear(scale_format):
    torch.manual_seed(0)
    layer = FP8Linear(384, 320, scale_format=scale_format)
    x = torch.randn(4, 64, 384, dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    grad = torch.randn_like(y)
    y.backward(grad)
    y64, gx64, gw64, gb64 = _float64_linear(x, layer.weight, layer.bias, grad)
    assert _rel(y, y64) < FORWARD_BOUND
    assert _rel(x.grad, gx64) < DGRAD_BOUND
    assert _rel(layer.weight.grad, gw64) < WGRAD_BOUND
    assert _rel(layer.bias.grad, gb64) < 1e-6
    bf16 = torch.nn.Linear(384, 320, dtype=torch.bfloat16)
    with torch.no_grad():
        bf16.weight.copy_(layer.weight), bf16.bias.copy_(layer.bias)
    assert _rel(bf16(x), y64) < _rel(y, y64), "sanity: FP8 is the less accurate of the two"


def test_gradients_come_back_in_the_dtypes_of_their_inputs():
    layer = FP8Linear(130, 70)  # float32 master weight, partial blocks both ways
    x = torch.randn(3, 130, dtype=torch.bfloat16, requires_grad=True)
    layer(x).float().square().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and x.grad.shape == x.shape
    assert layer.weight.grad.dtype == torch.float32 and layer.bias.grad.dtype == torch.float32
    bf16_layer = FP8Linear(130, 70, dtype=torch.bfloat16)
    bf16_layer(x).sum().backward()
    assert bf16_layer.weight.grad.dtype == torch.bfloat16


def test_backward_is_exactly_the_dgrad_and_wgrad_of_the_precision_flow():
    torch.manual_seed(1)
    layer = FP8Linear(200, 300)
    x = torch.randn(150, 200, requires_grad=True)
    y = layer(x)
    grad = torch.randn_like(y)
    y.backward(grad)
    wq = layer.quantized_weight()  # DGrad reuses the forward's 128x128 blocks, transposed
    # on CPU the backward GEMMs accumulate the same FP8 operands in float32 (no invariance needed)
    dgrad = fp8_gemm_dequantized(per_token_group_quant(grad), wq.t(), out_dtype=torch.float32)
    saved_x = requant_to_column_groups(per_token_group_quant(x.detach()))
    wgrad = fp8_gemm_dequantized(
        per_column_group_quant(grad).t(), saved_x.t(), out_dtype=torch.float32
    )
    torch.testing.assert_close(
        dgrad,
        fp8_gemm(per_token_group_quant(grad), wq.t(), out_dtype=torch.float32),
        rtol=1e-5,
        atol=1e-5,
    )
    assert torch.equal(x.grad, dgrad)
    assert torch.equal(layer.weight.grad, wgrad)
    assert torch.equal(layer.bias.grad, grad.sum(0))


def test_activation_is_saved_in_fp8_not_bf16():
    layer = FP8Linear(256, 128)
    x = torch.randn(512, 256, dtype=torch.bfloat16, requires_grad=True)
    saved: list[torch.Tensor] = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    big = [t for t in saved if t.numel() >= x.numel()]
    assert big and all(t.dtype == FP8_DTYPE for t in big), [(t.dtype, t.shape) for t in saved]
    assert not any(t.dtype == torch.bfloat16 for t in saved)


@pytest.mark.parametrize("bias", [True, False])
def test_fp8_linear_is_bitwise_equal_to_module_forward(bias):
    torch.manual_seed(2)
    layer = FP8Linear(300, 260, bias=bias)
    x = torch.randn(2, 33, 300, dtype=torch.bfloat16)
    trained = layer(x.clone().requires_grad_())  # the autograd path
    with torch.no_grad():
        inference = layer(x)
    shipped = fp8_linear(x, layer.quantized_weight(), layer.bias)
    assert trained.dtype == torch.bfloat16 and trained.shape == (2, 33, 260)
    assert torch.equal(trained.view(torch.int16), shipped.view(torch.int16))
    assert torch.equal(inference.view(torch.int16), shipped.view(torch.int16))


def test_module_rows_are_bitwise_independent_of_batch_size():
    layer = FP8Linear(256, 384)
    row = torch.randn(1, 256, dtype=torch.bfloat16)
    batch = torch.randn(257, 256, dtype=torch.bfloat16)
    batch[100] = row[0]
    with torch.no_grad():
        assert torch.equal(layer(row)[0].view(torch.int16), layer(batch)[100].view(torch.int16))


def test_quantized_weight_is_computed_once_per_step_and_refreshed_after_optimizer_step():
    torch.manual_seed(3)
    layer = FP8Linear(256, 256)
    for optimizer in (
        torch.optim.SGD(layer.parameters(), lr=0.1),
        torch.optim.AdamW(layer.parameters()),
    ):
        first = layer.quantized_weight()
        layer(torch.randn(8, 256, requires_grad=True)).sum().backward()
        assert layer.quantized_weight() is first, "forward/backward reuse the cached quantization"
        optimizer.step()
        optimizer.zero_grad()
        refreshed = layer.quantized_weight()
        assert refreshed is not first
        expected = per_block_quant(layer.weight.detach())
        assert torch.equal(refreshed.codes, expected.codes) and torch.equal(
            refreshed.scale, expected.scale
        )
        assert layer.quantized_weight() is refreshed


def test_invalidate_quantized_picks_up_writes_through_weight_data():
    layer = FP8Linear(128, 128)
    before = layer.quantized_weight()
    layer.weight.data.mul_(2.0)  # .data writes do not bump the autograd version
    layer.invalidate_quantized()
    after = layer.quantized_weight()
    assert torch.equal(after.scale, before.scale * 2) and torch.equal(after.codes, before.codes)


def test_load_state_dict_refreshes_the_quantization():
    layer, other = FP8Linear(128, 128), FP8Linear(128, 128)
    layer.quantized_weight()
    layer.load_state_dict(other.state_dict())
    assert torch.equal(layer.quantized_weight().scale, other.quantized_weight().scale)


def test_from_quantized_forward_equals_fp8_linear_and_has_no_trainable_state():
    trainer = FP8Linear(300, 200)
    shipped = trainer.quantized_weight()
    engine = FP8Linear.from_quantized(shipped, trainer.bias.detach().clone())
    assert not any(p.requires_grad for p in engine.parameters())
    assert {"weight_codes", "weight_scale", "bias"} <= set(engine.state_dict())
    x = torch.randn(5, 300, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(engine(x), trainer(x))
    assert torch.equal(engine(x), fp8_linear(x, shipped, trainer.bias))


def test_load_quantized_replaces_in_place_and_names_the_mismatch():
    engine = FP8Linear.from_quantized(per_block_quant(torch.randn(200, 300)))
    codes_storage = engine.weight_codes.data_ptr()
    update = per_block_quant(torch.randn(200, 300))
    engine.load_quantized(update)
    assert engine.weight_codes.data_ptr() == codes_storage
    assert torch.equal(engine.weight_codes, update.codes) and torch.equal(
        engine.weight_scale, update.scale
    )
    with pytest.raises(ValueError, match=r"weight.codes is \(200, 260\)"):
        engine.load_quantized(per_block_quant(torch.randn(200, 260)))
    with pytest.raises(ValueError, match="128x128-block"):
        engine.load_quantized(per_token_group_quant(torch.randn(200, 300)))
    with pytest.raises(ValueError, match="master weight"):
        FP8Linear(300, 200).load_quantized(update)


def test_nan_activation_raises_instead_of_producing_nan_scales():
    layer = FP8Linear(128, 64)
    x = torch.randn(4, 128)
    x[2, 5] = float("nan")
    with pytest.raises(ValueError, match="linear input: non-finite"):
        layer(x)
    with pytest.raises(ValueError, match="grad_output: non-finite"):
        layer(torch.randn(4, 128, requires_grad=True)).sum().mul(float("inf")).backward()


def test_check_finite_off_skips_the_check_and_never_changes_results():
    layer = FP8Linear(200, 64, check_finite=False)
    x = torch.randn(6, 200)
    checked = fp8_linear(x, layer.quantized_weight(), layer.bias)
    assert torch.equal(layer(x), checked)
    x[0, 0] = float("nan")
    assert bool(torch.isnan(layer(x)[0]).any())  # no error raised: the caller opted out


def test_wrong_input_width_and_weight_granularity_are_user_errors():
    with pytest.raises(ValueError, match="input has 100 features"):
        fp8_linear(torch.randn(2, 100), per_block_quant(torch.randn(8, 128)))
    with pytest.raises(ValueError, match="128x128-block"):
        fp8_linear(torch.randn(2, 128), per_token_group_quant(torch.randn(8, 128)))


def test_a_frozen_quantized_layer_passes_the_gradient_to_its_input():
    torch.manual_seed(0)
    layer = FP8Linear.from_quantized(per_block_quant(torch.randn(256, 256) * 0.02))
    x = torch.randn(3, 256, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
