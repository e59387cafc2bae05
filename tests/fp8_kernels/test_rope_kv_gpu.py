"""GPU tests (H200) of the fused RoPE + KV-cache write: bitwise the torch composition for BF16
and FP8 caches, decode and prefill shapes, GQA, q/k/v as views of one qkv output, and the FP8
scales read from the device under CUDA-graph replay."""

from __future__ import annotations

import pytest
import torch

from fp8rl.kernels.invariant import rope_table
from fp8rl.kernels.rope_kv import rope_kv_write, rope_kv_write_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
CUDA = "cuda"


def _inputs(b, length, heads, kv_heads, d, cap, *, seed=0):
    g = torch.Generator(device=CUDA).manual_seed(seed)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    cos_t, sin_t = (t.to(CUDA) for t in rope_table(d, cap, inv_freq.float()))
    start = torch.randint(0, cap - length + 1, (b, 1), device=CUDA, generator=g)
    positions = start + torch.arange(length, device=CUDA)[None]
    qkv = torch.randn(b, length, (heads + 2 * kv_heads) * d, device=CUDA, generator=g) * 3
    qkv = qkv.bfloat16()
    q = qkv[..., : heads * d].view(b, length, heads, d)
    k = qkv[..., heads * d : (heads + kv_heads) * d].view(b, length, kv_heads, d)
    v = qkv[..., (heads + kv_heads) * d :].view(b, length, kv_heads, d)
    return q, k, v, cos_t[positions], sin_t[positions], positions


def _caches(b, kv_heads, cap, d, dtype, n=4):
    return [torch.zeros(b, kv_heads, cap, d, dtype=dtype, device=CUDA) for _ in range(n)]


def _same(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize(
    ("b", "length", "heads", "kv_heads", "d", "cap"),
    [
        (64, 1, 32, 8, 128, 640),
        (3, 37, 28, 4, 128, 64),
        (5, 1, 16, 16, 64, 9),
        (2, 7, 8, 1, 128, 7),
    ],
)
def test_fused_rope_kv_write_is_bitwise_the_torch_composition(
    b, length, heads, kv_heads, d, cap, fp8
):
    q, k, v, cos, sin, pos = _inputs(b, length, heads, kv_heads, d, cap)
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    fused_k, fused_v, ref_k, ref_v = _caches(b, kv_heads, cap, d, dtype)
    scales = (torch.tensor(0.011, device=CUDA), torch.tensor(0.007, device=CUDA)) if fp8 else ()
    out = rope_kv_write(q, k, v, cos, sin, pos, fused_k, fused_v, *scales)
    ref = rope_kv_write_reference(q, k, v, cos, sin, pos, ref_k, ref_v, *scales)
    assert torch.equal(out, ref) and out.stride() == ref.stride()
    assert _same(fused_k, ref_k) and _same(fused_v, ref_v)
    assert fused_k.float().abs().sum() > 0  # something was written


def test_fused_rope_kv_write_reads_new_fp8_scales_on_graph_replay():
    b, heads, kv_heads, d, cap = 8, 8, 2, 128, 32
    q, k, v, cos, sin, pos = _inputs(b, 1, heads, kv_heads, d, cap, seed=3)
    k_scale, v_scale = torch.tensor(0.02, device=CUDA), torch.tensor(0.03, device=CUDA)
    fused_k, fused_v, ref_k, ref_v = _caches(b, kv_heads, cap, d, torch.float8_e4m3fn)
    rope_kv_write(q, k, v, cos, sin, pos, fused_k, fused_v, k_scale, v_scale)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rope_kv_write(q, k, v, cos, sin, pos, fused_k, fused_v, k_scale, v_scale)
    k_scale.fill_(0.005)
    v_scale.fill_(0.009)
    graph.replay()
    ref = rope_kv_write_reference(q, k, v, cos, sin, pos, ref_k, ref_v, k_scale, v_scale)
    assert torch.equal(out, ref)
    assert _same(fused_k, ref_k) and _same(fused_v, ref_v)
