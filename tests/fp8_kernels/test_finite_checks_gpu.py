"""On CUDA, an FP8Linear forward + backward inside ``deferred_finite_checks`` makes no host
sync (the trainer's micro-batch), and a NaN in the backward, which autograd runs in its own
device thread, is still caught at the block's end."""

from __future__ import annotations

import pytest
import torch

from fp8rl.kernels import FP8Linear, deferred_finite_checks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _layer_and_input():
    torch.manual_seed(0)
    layer = FP8Linear(512, 384, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    layer.quantized_weight()  # cached once per optimizer step, as in the trainer
    torch.cuda.synchronize()
    return layer, x, torch.randn(256, 384, device="cuda", dtype=torch.bfloat16)


def _forward_backward_refusing_syncs(layer, x, grad) -> None:
    torch.cuda.set_sync_debug_mode("error")
    try:
        layer(x).backward(grad)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_a_forward_and_backward_inside_the_block_make_no_host_sync():
    layer, x, grad = _layer_and_input()
    with pytest.raises(RuntimeError, match="synchroniz"):  # the immediate checks do sync
        _forward_backward_refusing_syncs(layer, x, grad)
    x.grad = layer.weight.grad = None
    with deferred_finite_checks():
        _forward_backward_refusing_syncs(layer, x, grad)
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all()


def test_a_non_finite_gradient_in_the_cuda_backward_is_caught_at_the_block_end():
    layer, x, grad = _layer_and_input()
    grad[7, 300] = float("nan")
    with (
        pytest.raises(ValueError, match=r"grad_output: non-finite.*row group"),
        deferred_finite_checks(),
    ):
        layer(x).backward(grad)
