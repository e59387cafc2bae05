"""Decode attention over the KV cache on CPU: the float64 reference is the decoder's attention,
the dispatch never fires on CPU or in exact mode, and the Triton kernels (under
TRITON_INTERPRET=1, float16: the interpreter's bfloat16 is unreliable) match the reference."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from fp8rl.kernels.decode_attention import (
    TARGET_PROGRAMS,
    decode_attention,
    decode_attention_reference,
    enabled,
    num_splits,
    set_enabled,
    use_decode_attention,
)
from fp8rl.kernels.invariant import attention, attention_mask
from fp8rl.kernels.kv import kv_dequantize, kv_quantize


def _case(b=3, h=8, hkv=2, lq=1, d=32, cap=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g).bfloat16()
    k = torch.randn(b, hkv, cap, d, generator=g).bfloat16()
    v = torch.randn(b, hkv, cap, d, generator=g).bfloat16()
    k_len = torch.randint(lq, cap + 1, (b,), generator=g)
    pos = k_len[:, None] - lq + torch.arange(lq)[None]
    return q, k, v, pos, k_len


@pytest.mark.parametrize(("h", "hkv", "lq"), [(4, 4, 1), (8, 2, 1), (8, 2, 3)])
def test_reference_equals_the_exact_attention_with_the_cache_mask(h, hkv, lq):
    q, k, v, pos, k_len = _case(h=h, hkv=hkv, lq=lq)
    mask = attention_mask(pos, k_len, k.shape[2])
    want = attention(q, k, v, mask, scale=0.2, exact=True)
    got = decode_attention_reference(q, k, v, pos, k_len, scale=0.2)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_reference_reads_an_fp8_cache_as_the_dequantized_values():
    q, k, v, pos, k_len = _case()
    ks, vs = torch.tensor(0.01), torch.tensor(0.02)
    kc, vc = kv_quantize(k, ks), kv_quantize(v, vs)
    mask = attention_mask(pos, k_len, k.shape[2])
    kd, vd = kv_dequantize(kc, ks, q.dtype), kv_dequantize(vc, vs, q.dtype)
    want = attention(q, kd, vd, mask, scale=0.2, exact=True)
    got = decode_attention_reference(q, kc, vc, pos, k_len, scale=0.2, k_scale=ks, v_scale=vs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    fast = attention(q, kd, vd, mask, scale=0.2, exact=False)
    torch.testing.assert_close(got, fast, rtol=2e-2, atol=2e-2)


def test_keys_at_or_past_k_len_do_not_change_the_result():
    q, k, v, pos, k_len = _case()
    k2, v2 = k.clone(), v.clone()
    for i, n in enumerate(k_len.tolist()):
        k2[i, :, n:] = float("nan")
        v2[i, :, n:] = 1e4
    a = decode_attention(q, k, v, pos, k_len, scale=0.2)
    b = decode_attention(q, k2, v2, pos, k_len, scale=0.2)
    assert torch.equal(a, b)


def test_an_fp8_cache_without_scales_is_refused():
    q, k, v, pos, k_len = _case()
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        decode_attention(q, kv_quantize(k, torch.tensor(1.0)), v, pos, k_len, scale=0.2)


def test_dispatch_is_off_by_default_for_fast_mode_parity():
    assert not enabled()


def test_dispatch_is_off_on_cpu_in_exact_mode_and_for_prefill_chunks():
    q = torch.zeros(2, 8, 1, 64, dtype=torch.bfloat16)
    previous = set_enabled(True)
    try:
        assert not use_decode_attention(q, 2, exact=False)  # CPU
        if torch.cuda.is_available():
            with torch.no_grad():
                assert use_decode_attention(q.cuda(), 2, exact=False)
                assert not use_decode_attention(q.cuda(), 2, exact=True)
                prefill = torch.zeros(2, 8, 16, 64, dtype=torch.bfloat16, device="cuda")
                assert not use_decode_attention(prefill, 2, exact=False)
    finally:
        set_enabled(previous)


def test_split_count_depends_on_shapes_only_and_keeps_splits_long():
    assert num_splits(64, 8, 448) == 1  # short contexts: one split (fastest on the H200)
    assert num_splits(64, 8, 4224) == 5  # ≤ 1024 keys per split
    assert num_splits(256, 8, 4224) == 2  # enough programs already
    assert num_splits(1, 1, 10**7) == TARGET_PROGRAMS  # at most TARGET_PROGRAMS programs


INTERPRETED = textwrap.dedent(
    """
    import torch
    from fp8rl.kernels.decode_attention import _launch, decode_attention_reference
    from fp8rl.kernels.kv import kv_quantize
    torch.manual_seed(0)
    for b, h, hkv, lq, d, cap, lens, fp8, splits, block_n in [
        (2, 4, 2, 1, 64, 200, [5, 130], False, 1, 64),
        (2, 4, 2, 1, 64, 200, [5, 130], False, 3, 64),
        (3, 8, 2, 2, 64, 300, [2, 77, 300], True, 4, 64),
        (3, 8, 2, 2, 64, 300, [2, 77, 300], True, 2, 128),
        (3, 4, 4, 1, 32, 300, [1, 64, 300], False, 5, 64),
        (2, 4, 2, 1, 32, 100, [100, 100], False, 3, 64),  # a [:, :, :100] view of a longer cache
    ]:
        q = torch.randn(b, h, lq, d).half()
        k, v = torch.randn(b, hkv, cap, d).half(), torch.randn(b, hkv, cap, d).half()
        ks = vs = None
        if fp8:
            ks, vs = torch.tensor(0.01), torch.tensor(0.02)
            k, v = kv_quantize(k, ks), kv_quantize(v, vs)
        k_len = torch.tensor(lens)
        pos = k_len[:, None] - lq + torch.arange(lq)[None]
        if cap == 100:  # keys past the view hold NaN and k_len claims more keys than it has
            fk, fv = (torch.full((b, hkv, 160, d), float("nan"), dtype=k.dtype) for _ in "kv")
            fk[:, :, :cap], fv[:, :, :cap] = k, v
            k, v, k_len = fk[:, :, :cap], fv[:, :, :cap], k_len + 50
        ref = decode_attention_reference(q, k, v, pos, k_len, scale=d**-0.5, k_scale=ks, v_scale=vs)
        out = _launch(q, k, v, pos, k_len, d**-0.5, ks, vs, splits, block_n)
        print(f"case splits={splits} fp8={fp8} err={(out.float() - ref.float()).abs().max():.3e}")
    """
)


def test_interpreted_kernels_match_the_reference_for_every_split_count():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("case")]
    assert len(lines) == 6
    for line in lines:
        assert float(line.split("err=")[1]) < 2e-3, line
