"""CPU behaviour of ``rope_kv_write``: the decode step's RoPE + KV-cache write (the fused kernel's
rounding is checked on the GPU and, for float32, under the Triton interpreter)."""

from __future__ import annotations

import pytest
import torch

from fp8rl.kernels.invariant import apply_rope, rope_table
from fp8rl.kernels.kv import kv_quantize
from fp8rl.kernels.rope_kv import rope_kv_write


def _step(fp8: bool):
    torch.manual_seed(0)
    b, heads, kv_heads, d, cap = 2, 4, 2, 16, 6
    cos_t, sin_t = rope_table(d, cap, 1.0 / (10000 ** (torch.arange(0, d, 2) / d)))
    pos = torch.tensor([[3], [5]])
    q, k, v = (torch.randn(b, 1, n, d).bfloat16() for n in (heads, kv_heads, kv_heads))
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    caches = [torch.zeros(b, kv_heads, cap, d, dtype=dtype) for _ in range(2)]
    return q, k, v, cos_t[pos], sin_t[pos], pos, caches


@pytest.mark.parametrize("fp8", [False, True])
def test_rope_kv_write_rotates_q_and_stores_k_v_at_each_position(fp8):
    q, k, v, cos, sin, pos, (k_cache, v_cache) = _step(fp8)
    scales = (torch.tensor(0.01), torch.tensor(0.02)) if fp8 else ()
    out = rope_kv_write(q, k, v, cos, sin, pos, k_cache, v_cache, *scales)
    assert torch.equal(out, apply_rope(q.transpose(1, 2), cos, sin))
    k_rot = apply_rope(k.transpose(1, 2), cos, sin)
    want_k, want_v = (k_rot, v.transpose(1, 2))
    if fp8:
        want_k, want_v = kv_quantize(want_k, scales[0]), kv_quantize(want_v, scales[1])
    for row, p in enumerate(pos[:, 0].tolist()):
        assert torch.equal(k_cache[row, :, p].float(), want_k[row, :, 0].float())
        assert torch.equal(v_cache[row, :, p].float(), want_v[row, :, 0].float())
        others = [i for i in range(k_cache.shape[2]) if i != p]
        assert k_cache[row, :, others].float().abs().sum() == 0


def test_rope_kv_write_refuses_an_fp8_cache_without_scales():
    q, k, v, cos, sin, pos, (k_cache, v_cache) = _step(True)
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        rope_kv_write(q, k, v, cos, sin, pos, k_cache, v_cache)
