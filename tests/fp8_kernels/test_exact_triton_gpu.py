"""GPU tests of the exact mode's Triton kernels: the batch-invariant flash attention
(``attention_exact_triton``), dense head GEMM (``dense_exact_triton``) and token log-softmax
and entropy (``logprob_triton``, which fast mode runs too), and the head cast once per pass.

Invariance is tested bitwise (rows of a full-sequence call vs per-position decode calls over
larger caches, batch 1 vs many); accuracy and gradients against float64 references with stated
tolerances; the backward for determinism (two runs bitwise equal)."""

from __future__ import annotations

import pytest
import torch

from fp8rl.kernels import attention_cudnn_bwd as fused_bwd
from fp8rl.kernels.attention_exact_triton import exact_attention
from fp8rl.kernels.dense_exact_triton import exact_dense_gemm
from fp8rl.kernels.invariant import (
    attention,
    attention_mask,
    dense_linear,
    token_logprobs,
    visible_keys,
)
from fp8rl.kernels.logprob_triton import exact_token_logprobs, token_logprobs_entropy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
CUDA = "cuda"
BF16 = torch.bfloat16


def _qkv(b, h, hkv, lq, lk, d=128, seed=0):
    g = torch.Generator(device=CUDA).manual_seed(seed)
    q = torch.randn(b, h, lq, d, device=CUDA, dtype=BF16, generator=g)
    k = torch.randn(b, hkv, lk, d, device=CUDA, dtype=BF16, generator=g)
    v = torch.randn(b, hkv, lk, d, device=CUDA, dtype=BF16, generator=g)
    return q, k, v


def _reference(q, k, v, mask, scale):
    """float64 attention (the CPU exact path's math)."""
    groups = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(groups, 1)
    v = v.double().repeat_interleave(groups, 1)
    s = (q.double() @ k.transpose(-1, -2)) * scale
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v


@pytest.mark.parametrize("length", [1, 77, 300])
def test_full_sequence_rows_equal_decode_steps_over_larger_caches(length):
    b, h, hkv, d = 3, 8, 2, 128
    q, k, v = _qkv(b, h, hkv, length, length)
    pos = torch.arange(length, device=CUDA).expand(b, length)
    k_len = torch.tensor([length, max(1, length // 2), length], device=CUDA)
    mask = attention_mask(pos, k_len, length)
    full = attention(q, k, v, mask, scale=d**-0.5, exact=True)
    for capacity in (length, length + 5, length + 200):
        kc = torch.zeros(b, hkv, capacity, d, device=CUDA, dtype=BF16)
        vc = torch.randn(b, hkv, capacity, d, device=CUDA, dtype=BF16)  # stale tail values
        kc[:, :, :length], vc[:, :, :length] = k, v
        for p in sorted({0, length // 3, length - 1}):
            qp = pos[:, p : p + 1]
            step_mask = attention_mask(qp, k_len, capacity)
            out = attention(q[:, :, p : p + 1], kc, vc, step_mask, scale=d**-0.5, exact=True)
            assert torch.equal(out, full[:, :, p : p + 1]), (capacity, p)


@pytest.mark.parametrize(
    ("h", "hkv", "d"), [(32, 8, 128), (28, 4, 128), (16, 2, 64), (16, 1, 128), (8, 2, 256)]
)
def test_decode_rows_are_the_trainer_rows_and_decode_tiles_stay_close(h, hkv, d):
    """A decode call (Lq = 1) must give each row bitwise the trainer's row of that position for
    Llama (G 4), Qwen (G 7), G 8 and G 16, positions on both sides of key-block edges. The
    opt-in 16-row decode tiles (not bitwise on model activations) stay within BF16 rounding."""
    b, length = 3, 520
    q, k, v = _qkv(b, h, hkv, length, length, d=d, seed=3)
    full_nvis = torch.arange(1, length + 1, device=CUDA).expand(b, length)
    full = exact_attention(q, k, v, full_nvis, scale=d**-0.5)
    kc = torch.randn(b, hkv, 640, d, device=CUDA, dtype=BF16)  # a larger cache, stale tail
    vc = torch.randn(b, hkv, 640, d, device=CUDA, dtype=BF16)
    kc[:, :, :length], vc[:, :, :length] = k, v
    for p in (0, 1, 63, 64, 65, 127, 128, 300, 519):
        nvis = torch.full((b, 1), p + 1, device=CUDA, dtype=torch.int32)
        out = exact_attention(q[:, :, p : p + 1], kc, vc, nvis, scale=d**-0.5)
        assert torch.equal(out, full[:, :, p : p + 1]), p
        tiles = exact_attention(q[:, :, p : p + 1], kc, vc, nvis, scale=d**-0.5, decode_tiles=True)
        torch.testing.assert_close(tiles, out, rtol=1.6e-2, atol=1e-3)


def test_rows_do_not_depend_on_the_batch():
    b, h, hkv, length, d = 6, 4, 4, 200, 128
    q, k, v = _qkv(b, h, hkv, length, length, seed=1)
    nvis = torch.arange(1, length + 1, device=CUDA).expand(b, length)
    many = exact_attention(q, k, v, nvis, scale=d**-0.5)
    for i in (0, 4):
        s = slice(i, i + 1)
        assert torch.equal(exact_attention(q[s], k[s], v[s], nvis[s], scale=d**-0.5), many[s])


def test_prefix_keyword_arguments_match_the_mask():
    b, h, hkv, length, d = 2, 8, 2, 130, 64
    q, k, v = _qkv(b, h, hkv, length, length, d=d, seed=2)
    pos = torch.arange(length, device=CUDA).expand(b, length)
    k_len = torch.tensor([length, 50], device=CUDA)
    mask = attention_mask(pos, k_len, length)
    a = attention(q, k, v, mask, scale=d**-0.5, exact=True)
    kw = attention(q, k, v, mask, scale=d**-0.5, exact=True, q_pos=pos, k_len=k_len)
    assert torch.equal(a, kw)
    counts = attention(q, k, v, visible_keys(pos, k_len), scale=d**-0.5, exact=True)
    assert torch.equal(a, counts)


@pytest.mark.parametrize("tailed", [False, True], ids=["randn", "student-t"])
@pytest.mark.parametrize("exact", [True, False])
def test_fp8_cache_read_in_place_gives_the_round_tripped_rows_bitwise(exact, tailed):
    """The engine's FP8 KV cache, read in place, against the trainer's kv_round_trip keys, on
    N(0, 1) inputs and on heavy-tailed ones (Student-t, 4x outlier channels: many codes near
    the scale's edges and subnormal codes)."""
    from fp8rl.kernels.kv import kv_quantize, kv_round_trip, kv_scale_from_amax

    b, h, hkv, length, d = 3, 32, 8, 150, 128
    q, k, v = _qkv(b, h, hkv, length, length, seed=5)
    if tailed:
        g = torch.Generator().manual_seed(5)
        t = torch.distributions.StudentT(4.0)
        q, k, v = (
            (t.sample(x.shape) * (1 + 3 * (torch.rand(d, generator=g) > 0.95).float()))
            .clamp(-30, 30)
            .to(CUDA, BF16)
            for x in (q, k, v)
        )
    ks, vs = kv_scale_from_amax(k.abs().amax()), kv_scale_from_amax(v.abs().amax())
    pos = torch.arange(length, device=CUDA).expand(b, length)
    k_len = torch.tensor([length, 97, length], device=CUDA)
    kt, vt = kv_round_trip(k, ks, BF16), kv_round_trip(v, vs, BF16)
    full = attention(q, kt, vt, None, scale=d**-0.5, exact=exact, q_pos=pos, k_len=k_len)
    capacity = length + 70
    kc = torch.zeros(b, hkv, capacity, d, device=CUDA, dtype=torch.float8_e4m3fn)
    vc = torch.zeros_like(kc)
    kc[:, :, :length], vc[:, :, :length] = kv_quantize(k, ks), kv_quantize(v, vs)
    for p in (0, 63, 64, 96, length - 1):
        qp = pos[:, p : p + 1]
        step = attention(
            q[:, :, p : p + 1], kc, vc, None, scale=d**-0.5, exact=exact, q_pos=qp, k_len=k_len,
            k_scale=ks, v_scale=vs,
        )  # fmt: skip
        assert torch.equal(step, full[:, :, p : p + 1]), p


def test_fast_mode_runs_the_invariant_kernel_unless_sdpa_is_chosen():
    from fp8rl.kernels.invariant import set_fast_attention

    b, h, hkv, length, d = 2, 8, 2, 200, 128
    q, k, v = _qkv(b, h, hkv, length, length, seed=6)
    pos = torch.arange(length, device=CUDA).expand(b, length)
    k_len = torch.tensor([length, 120], device=CUDA)
    mask = attention_mask(pos, k_len, length)
    exact = attention(q, k, v, mask, scale=d**-0.5, exact=True)
    assert torch.equal(attention(q, k, v, mask, scale=d**-0.5, exact=False), exact)
    previous = set_fast_attention("sdpa")
    try:
        sdpa = attention(q, k, v, mask, scale=d**-0.5, exact=False)
    finally:
        set_fast_attention(previous)
    torch.testing.assert_close(sdpa, exact, atol=4e-3, rtol=2e-2)  # same math, other rounding


def test_forward_is_close_to_float64_attention():
    b, h, hkv, length, d = 2, 8, 2, 513, 128
    q, k, v = _qkv(b, h, hkv, length, length, seed=3)
    pos = torch.arange(length, device=CUDA).expand(b, length)
    mask = attention_mask(pos, torch.tensor([length, 400], device=CUDA), length)
    out = attention(q, k, v, mask, scale=d**-0.5, exact=True)
    ref = _reference(q, k, v, mask, d**-0.5)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("d", [64, 128, 256])  # 256: the wide tiles (shared memory)
def test_backward_is_close_to_float64_and_deterministic(d):
    b, h, hkv, length = 2, 8, 2, 300
    q, k, v = _qkv(b, h, hkv, length, length, d=d, seed=4)
    pos = torch.arange(length, device=CUDA).expand(b, length)
    k_len = torch.tensor([length, 211], device=CUDA)
    mask = attention_mask(pos, k_len, length)
    grad = torch.randn(b, h, length, d, device=CUDA, dtype=BF16)

    def grads(dtype, fn):
        ins = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        (fn(*ins).to(dtype) * grad.to(dtype)).sum().backward()
        return [t.grad for t in ins]

    triton_run = lambda *t: attention(*t, mask, scale=d**-0.5, exact=True)  # noqa: E731
    first = grads(BF16, triton_run)
    second = grads(BF16, triton_run)
    ref = grads(torch.float64, lambda *t: _reference(*t, mask, d**-0.5))
    for a, a2, r in zip(first, second, ref, strict=True):
        assert torch.equal(a, a2)
        err = (a.double() - r).abs().max() / r.abs().max()
        assert err < 2e-2, err.item()


def _grads(q, k, v, n_visible, grad, dtype=BF16, fn=None):
    ins = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    fn = fn or (lambda *t: exact_attention(*t, n_visible, scale=q.shape[-1] ** -0.5))
    (fn(*ins).to(dtype) * grad.to(dtype)).sum().backward()
    return [t.grad for t in ins]


def _spy_cudnn(monkeypatch):
    """Record, per cuDNN backward call, whether it returned gradients (False: a refusal)."""
    taken = []
    real = fused_bwd.backward

    def spy(*args):
        result = real(*args)
        taken.append(result is not None)
        return result

    monkeypatch.setattr(fused_bwd, "backward", spy)
    return taken


@pytest.mark.parametrize("d", [64, 128])
def test_trainer_backward_on_cudnn_matches_float64_and_the_triton_kernels(d, monkeypatch):
    """Causal rows plus padding rows without a gradient (a masked RL loss): cuDNN's backward runs
    (two runs bitwise) and its gradients are as close to float64 as Triton's."""
    b, h, hkv, length = 2, 8, 2, 300
    q, k, v = _qkv(b, h, hkv, length, length, d=d, seed=5)
    pos = torch.arange(length, device=CUDA).expand(b, length)
    k_len = torch.tensor([length, 211], device=CUDA)
    nvis = visible_keys(pos, k_len)
    grad = torch.randn(b, h, length, d, device=CUDA, dtype=BF16)
    grad = grad.masked_fill((pos >= k_len[:, None])[:, None, :, None], 0.0)
    taken = _spy_cudnn(monkeypatch)
    fused, fused_again = _grads(q, k, v, nvis, grad), _grads(q, k, v, nvis, grad)
    assert taken == [True, True]
    previous = fused_bwd.set_enabled(False)
    try:
        tri = _grads(q, k, v, nvis, grad)
    finally:
        fused_bwd.set_enabled(previous)
    assert taken == [True, True]
    mask = attention_mask(pos, k_len, length)
    ref = _grads(q, k, v, nvis, grad, torch.float64, lambda *t: _reference(*t, mask, d**-0.5))
    for a, a2, t, r in zip(fused, fused_again, tri, ref, strict=True):
        assert torch.equal(a, a2)
        err, tri_err = ((x.double() - r).abs().max() / r.abs().max() for x in (a, t))
        assert err < 2e-2 and err < 2 * tri_err + 1e-3, (err.item(), tri_err.item())


@pytest.mark.parametrize(("dtype", "spike"), [(BF16, 30.0), (torch.float16, 12.0)])
def test_padding_keys_with_huge_scores_give_no_nan_in_the_cudnn_backward(dtype, spike, monkeypatch):
    """Padding rows and keys that would score far above the rows' log-sum-exp under a causal mask
    (they never saw those keys): the silent rows' statistic keeps every gradient finite and equal
    to the Triton kernels' within rounding."""
    g = torch.Generator(device=CUDA).manual_seed(7)
    q = torch.randn(2, 4, 128, 64, device=CUDA, generator=g) * 0.1
    k = torch.randn(2, 2, 128, 64, device=CUDA, generator=g) * 0.1
    v = torch.randn(2, 2, 128, 64, device=CUDA, generator=g)
    for t in (q, k):
        t[:, :, 64:, 0] = spike  # padding rows and keys: q·k up to spike² · scale
    pos = torch.arange(128, device=CUDA).expand(2, 128)
    k_len = torch.tensor([64, 100], device=CUDA)
    nvis = visible_keys(pos, k_len)
    grad = torch.randn(2, 4, 128, 64, device=CUDA, generator=g)
    grad = grad.masked_fill((pos >= k_len[:, None])[:, None, :, None], 0.0)
    q, k, v, grad = (t.to(dtype) for t in (q, k, v, grad))
    taken = _spy_cudnn(monkeypatch)
    fused = _grads(q, k, v, nvis, grad, dtype)
    assert taken == [True]
    previous = fused_bwd.set_enabled(False)
    try:
        tri = _grads(q, k, v, nvis, grad, dtype)
    finally:
        fused_bwd.set_enabled(previous)
    for a, t in zip(fused, tri, strict=True):
        assert torch.isfinite(a).all() and torch.isfinite(t).all()
        err = ((a.double() - t.double()).norm() / t.double().norm()).item()
        assert err < 2e-2, err


def test_dense_gemm_rows_are_bitwise_equal_at_m1_and_m4096():
    w = torch.randn(4000, 1024, device=CUDA) * 0.02  # fp32 master weight, used as BF16
    x = torch.randn(4096, 1024, device=CUDA, dtype=BF16)
    big = dense_linear(x, w, exact=True)
    for row in (0, 17, 4095):
        assert torch.equal(dense_linear(x[row : row + 1], w, exact=True)[0], big[row])
    ref = x.double() @ w.to(BF16).double().t()
    torch.testing.assert_close(big.double(), ref, atol=1e-2, rtol=1e-2)


def test_dense_gemm_gradients_match_autograd_of_the_bf16_linear():
    w = (torch.randn(300, 256, device=CUDA) * 0.05).requires_grad_()
    x = torch.randn(2, 5, 256, device=CUDA, dtype=BF16, requires_grad=True)
    g = torch.randn(2, 5, 300, device=CUDA, dtype=BF16)
    (exact_dense_gemm(x, w) * g).sum().backward()
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    (torch.nn.functional.linear(x, w.to(BF16)) * g).sum().backward()
    torch.testing.assert_close(gx, x.grad, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(gw, w.grad, atol=2e-2, rtol=2e-2)


def test_token_logprobs_rows_do_not_depend_on_the_batch_and_match_float64():
    logits = torch.randn(64, 128256, device=CUDA, dtype=BF16) * 3
    tokens = torch.randint(0, 128256, (64,), device=CUDA)
    for t in (1.0, 0.7):
        many = token_logprobs(logits, tokens, temperature=t, exact=True)
        for row in (0, 63):
            one = token_logprobs(
                logits[row : row + 1], tokens[row : row + 1], temperature=t, exact=True
            )
            assert torch.equal(one[0], many[row])
        ref = torch.log_softmax(logits.double() / t, -1).gather(-1, tokens[:, None])[:, 0]
        torch.testing.assert_close(many.double(), ref, atol=1e-4, rtol=1e-5)


def test_token_logprobs_gradient_matches_float64():
    logits = (torch.randn(8, 1000, device=CUDA) * 2).requires_grad_()
    tokens = torch.randint(0, 1000, (8,), device=CUDA)
    exact_token_logprobs(logits, tokens, temperature=0.8).sum().backward()
    got = logits.grad
    ref_in = logits.detach().double().requires_grad_()
    torch.log_softmax(ref_in / 0.8, -1).gather(-1, tokens[:, None]).sum().backward()
    torch.testing.assert_close(got.double(), ref_in.grad, atol=1e-5, rtol=1e-4)


def test_fast_token_logprobs_are_the_exact_rows_and_close_to_the_torch_path():
    from fp8rl.kernels.invariant import set_fast_logprobs

    logits = torch.randn(64, 128256, device=CUDA, dtype=BF16) * 3
    tokens = torch.randint(0, 128256, (64,), device=CUDA)
    exact = token_logprobs(logits, tokens, temperature=0.7, exact=True)
    assert torch.equal(token_logprobs(logits, tokens, temperature=0.7), exact)
    previous = set_fast_logprobs("torch")
    try:
        torch_rows = token_logprobs(logits, tokens, temperature=0.7)
    finally:
        set_fast_logprobs(previous)
    torch.testing.assert_close(torch_rows, exact, atol=1e-4, rtol=1e-5)


def test_bf16_token_logprobs_gradient_is_close_to_float64_in_bf16():
    logits = (torch.randn(16, 128256, device=CUDA) * 2).to(BF16).requires_grad_()
    tokens = torch.randint(0, 128256, (16,), device=CUDA)
    g = torch.randn(16, device=CUDA)
    (token_logprobs(logits, tokens, temperature=0.7) * g).sum().backward()
    ref_in = logits.detach().double().requires_grad_()
    ref = torch.log_softmax(ref_in / 0.7, -1).gather(-1, tokens[:, None])[:, 0]
    (ref * g.double()).sum().backward()
    assert logits.grad.dtype == BF16
    torch.testing.assert_close(logits.grad.double(), ref_in.grad, atol=1e-3, rtol=1e-2)


@pytest.mark.parametrize("exact", [False, True])
def test_a_head_cast_once_gives_the_casting_head_bits_and_gradients(exact):
    from fp8rl.kernels.dense_cast import cast_weight

    w = (torch.randn(4000, 1024, device=CUDA) * 0.02).requires_grad_()
    x = torch.randn(2048, 1024, device=CUDA, dtype=BF16, requires_grad=True)
    g = torch.randn(2048, 4000, device=CUDA, dtype=BF16)
    outs = []
    for cast in (None, cast_weight(w, BF16)):
        y = dense_linear(x, w, exact=exact, cast=cast)
        y.backward(g)
        outs.append((y, x.grad, w.grad))
        x.grad = w.grad = None
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)


def test_logprobs_with_entropy_are_the_plain_rows_and_the_entropy_is_close_to_float64():
    logits = (torch.randn(32, 128256, device=CUDA) * 3).to(BF16).requires_grad_()
    tokens = torch.randint(0, 128256, (32,), device=CUDA)
    g, g_ent = torch.randn(32, device=CUDA), torch.randn(32, device=CUDA)
    logp, ent = token_logprobs_entropy(logits, tokens, temperature=0.7)
    assert torch.equal(logp, exact_token_logprobs(logits.detach(), tokens, temperature=0.7))
    (logp * g + ent * g_ent).sum().backward()
    ref_in = logits.detach().double().requires_grad_()
    ref_logp = torch.log_softmax(ref_in / 0.7, -1)
    ref_ent = -(ref_logp.exp() * ref_logp).sum(-1)
    torch.testing.assert_close(ent.double(), ref_ent.detach(), atol=1e-4, rtol=1e-5)
    (
        ref_logp.gather(-1, tokens[:, None])[:, 0] * g.double() + ref_ent * g_ent.double()
    ).sum().backward()
    torch.testing.assert_close(logits.grad.double(), ref_in.grad, atol=1e-3, rtol=1e-2)
