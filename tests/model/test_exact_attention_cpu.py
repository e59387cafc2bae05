"""CPU side of the exact-mode kernels switch: the float64 paths stay in place on CPU (the CPU
engine and trainer stay bitwise with each other), with the new optional arguments accepted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fp8rl.kernels.invariant import (
    attention,
    attention_mask,
    float64_inside,
    rms_norm,
    silu_mul,
    triton_exact,
    visible_keys,
)


def test_cpu_exact_attention_accepts_prefix_arguments_and_ignores_them():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 9, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    pos, k_len = torch.arange(9).expand(2, 9), torch.tensor([9, 5])
    mask = attention_mask(pos, k_len, 9)
    plain = attention(q, k, v, mask, scale=8**-0.5, exact=True)
    kw = attention(q, k, v, mask, scale=8**-0.5, exact=True, q_pos=pos, k_len=k_len)
    assert torch.equal(plain, kw)


@pytest.mark.parametrize("exact", [True, False])
def test_visible_key_counts_attend_like_the_mask_they_stand_for(exact):
    torch.manual_seed(2)
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    pos, k_len = torch.tensor([[4, 5, 6], [0, 1, 8]]), torch.tensor([7, 3])
    counts = visible_keys(pos, k_len)
    assert counts.dtype == torch.int32
    assert counts.tolist() == [[5, 6, 7], [1, 2, 3]]
    mask = attention_mask(pos, k_len, 9)
    assert torch.equal(counts, mask[:, 0].sum(-1).int())
    by_mask = attention(q, k, v, mask, scale=8**-0.5, exact=exact)
    assert torch.equal(attention(q, k, v, counts, scale=8**-0.5, exact=exact), by_mask)


def test_cpu_exact_ops_still_run_in_float64_and_are_recomputed():
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    assert not triton_exact(x)
    assert all(float64_inside(fn, x) for fn in (attention, rms_norm, silu_mul))
    w = torch.ones(8)
    ref = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
    assert torch.equal(rms_norm(x, w, 1e-6, exact=True), ref)


def test_fp8_cache_codes_attend_like_their_dequantized_values_on_cpu():
    from fp8rl.kernels.kv import kv_dequantize, kv_quantize, kv_scale_from_amax

    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    ks, vs = kv_scale_from_amax(k.abs().amax()), kv_scale_from_amax(v.abs().amax())
    kc, vc = kv_quantize(k, ks), kv_quantize(v, vs)
    pos, k_len = torch.tensor([[4, 5, 6], [0, 1, 2]]), torch.tensor([7, 3])
    for exact in (True, False):
        codes = attention(
            q, kc, vc, None, scale=8**-0.5, exact=exact, q_pos=pos, k_len=k_len,
            k_scale=ks, v_scale=vs,
        )  # fmt: skip
        mask = attention_mask(pos, k_len, 9)
        deq = (kv_dequantize(kc, ks, q.dtype), kv_dequantize(vc, vs, q.dtype))
        assert torch.equal(codes, attention(q, *deq, mask, scale=8**-0.5, exact=exact))


def test_attention_without_a_mask_or_positions_or_fp8_scales_is_refused():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="mask or q_pos"):
        attention(q, k, k, None, scale=1.0)
    with pytest.raises(ValueError, match="integer counts"):  # an additive float mask
        attention(q, k, k, torch.zeros(1, 1, 3, 3), scale=1.0)
    with pytest.raises(ValueError, match=r"got torch.bool \(1, 3, 3\)"):  # no head axis
        attention(q, k, k, torch.ones(1, 3, 3, dtype=torch.bool), scale=1.0)
    with pytest.raises(ValueError, match=r"\[B, Lq\] = \(1, 3\)"):  # counts per key, not query
        attention(q, k[:, :, :2], k[:, :, :2], torch.ones(1, 2, dtype=torch.int32), scale=1.0)
    codes = k.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="k_scale"):
        attention(q, codes, codes, None, scale=1.0, q_pos=torch.zeros(1, 3), k_len=torch.ones(1))


def test_fast_attention_leaves_head_sizes_the_kernel_lacks_to_sdpa(monkeypatch):
    from fp8rl.kernels import invariant

    monkeypatch.setattr(invariant, "triton_exact", lambda x: True)  # as on a GPU
    x = torch.zeros(1, 2, 3, 128)
    assert invariant.triton_attention(x, exact=False)
    assert not invariant.triton_attention(x, exact=False, head_dim=80)
    assert invariant.triton_attention(x, exact=True, head_dim=80)  # exact: the kernel refuses


def test_decode_tiles_are_a_fast_mode_triton_choice_and_a_typo_is_refused(monkeypatch):
    from fp8rl.kernels import invariant

    monkeypatch.setattr(invariant, "triton_exact", lambda x: True)  # as on a GPU
    x = torch.zeros(1, 2, 3, 128)
    previous = invariant.set_fast_attention("triton_decode16")
    try:
        assert invariant.triton_attention(x, exact=False)
        with pytest.raises(ValueError, match="triton_decode16"):
            invariant.set_fast_attention("triton16")
        assert invariant.set_fast_attention("sdpa") == "triton_decode16"
        assert not invariant.triton_attention(x, exact=False)
    finally:
        invariant.set_fast_attention(previous)


def test_a_kv_cache_is_not_selected_into_tensors_of_another_shape():
    from fp8rl.workers.model.config import PRESETS
    from fp8rl.workers.model.decoder import KVCache

    cfg = PRESETS["tiny-llama"]
    cache = KVCache.allocate(cfg, batch=3, capacity=16, dtype=torch.bfloat16, device="cpu")
    index = torch.tensor([0, 0, 2, 1])
    out = KVCache.allocate(cfg, batch=4, capacity=16, dtype=torch.bfloat16, device="cpu")
    pointers = [t.data_ptr() for t in out.k]
    assert cache.select(index, out=out) is out and [t.data_ptr() for t in out.k] == pointers
    wrong = KVCache.allocate(cfg, batch=4, capacity=32, dtype=torch.bfloat16, device="cpu")
    with pytest.raises(ValueError, match="select"):
        cache.select(index, out=wrong)


@pytest.mark.parametrize(("dtype", "fused"), [(torch.bfloat16, True), (torch.float32, False)])
def test_exact_blocks_fuse_on_cuda_only_where_their_norm_is_the_fused_kernels(
    dtype, fused, monkeypatch
):
    from types import SimpleNamespace

    from fp8rl.protocol import QuantConfig
    from fp8rl.workers.model import decoder
    from fp8rl.workers.model.build import build_decoder
    from fp8rl.workers.model.config import PRESETS
    from fp8rl.workers.model.linear import LayerPrecision

    precision = LayerPrecision(
        dtype=dtype, fp8=True, quant=QuantConfig(), exact=True, trainable=False
    )
    model = build_decoder(
        PRESETS["tiny-llama"], precision, state_dict=None, max_positions=32, param_dtype=dtype
    )
    block = model.model.layers[0]
    with torch.no_grad():
        assert not block.fused_ready()  # CPU: float64 norm and SiLU
        monkeypatch.setattr(decoder, "triton_available", lambda: True)
        assert block._exact_on_triton(SimpleNamespace(is_cuda=True)) is fused


def test_fast_logprobs_choose_the_triton_rows_on_cuda_and_key_kept_graphs(monkeypatch):
    from fp8rl.kernels import invariant
    from fp8rl.workers.rollout.cuda_graphs import kernel_switches

    logits = SimpleNamespace(is_cuda=True)  # logits on a GPU
    monkeypatch.setattr(invariant, "triton_available", lambda: True)
    assert invariant.triton_logprobs(logits, exact=False)
    before = kernel_switches()
    previous = invariant.set_fast_logprobs("torch")
    try:
        assert not invariant.triton_logprobs(logits, exact=False)
        assert invariant.triton_logprobs(logits, exact=True)  # exact mode always runs the rows
        assert kernel_switches() != before
        with pytest.raises(ValueError, match="triton"):
            invariant.set_fast_logprobs("fused")
    finally:
        invariant.set_fast_logprobs(previous)
