"""Run under TRITON_INTERPRET=1 (CPU) by test_triton_interpreter.py; prints one line per case.

The interpreter's float32→float8 and float32→bfloat16 casts do not round to nearest like the
GPU's, so FP8 codes are compared with another Triton path (the interpreted quantizer), never with
torch's cast, and the fused elementwise kernels run on float32 data (no bfloat16 rounding).
"""

from __future__ import annotations

import torch

from fp8rl.kernels import (
    fp8_gemm_reference,
    fused,
    fused_triton,
    per_block_quant_reference,
    quant_triton,
)
from fp8rl.kernels import gemm_decode_triton as dec
from fp8rl.kernels.invariant import rope_table
from fp8rl.kernels.rope_kv import rope_kv_write_reference
from fp8rl.kernels.rope_kv_triton import rope_kv_write_triton
from fp8rl.kernels.transpose_triton import transpose_codes


def decode_gemm_cases() -> None:
    torch.manual_seed(0)
    cases = [(3, 256, 512, 16, 64, 1), (20, 128, 1000, 16, 32, 4), (40, 200, 384, 32, 128, 2)]
    for m, n, k, bm, bn, split in cases:
        cfg = dec.DecodeConfig(bm, bn, split)
        x = torch.randn(m, k, dtype=torch.bfloat16)
        w = per_block_quant_reference(torch.randn(n, k) * 0.02)
        xq = quant_triton.per_token_group_quant_triton(x)
        ref = fp8_gemm_reference(xq, w, out_dtype=torch.float32)
        out, scales = dec.fp8_gemm_decode(x, w, out_dtype=torch.float32, config=cfg)
        from_codes, _ = dec.fp8_gemm_decode(xq, w, out_dtype=torch.float32, config=cfg)
        err = float((out - ref).abs().max() / ref.abs().max())
        locks = int(dec._LOCKS[torch.device("cpu")].abs().sum())
        same = torch.equal(out, from_codes) and torch.equal(scales, xq.scale)
        print(f"decode m={m} n={n} k={k} split={split} err={err:.2e} same={same} locks={locks}")


def decode_loop_variant_cases() -> None:
    """Scales a trip early / two or four K blocks per trip / 128-row tiles against the plain
    loop (5 K blocks: the last trip of a pair or a quad is partly empty)."""
    torch.manual_seed(3)
    m, n, k = 5, 128, 640
    x = torch.randn(m, k, dtype=torch.bfloat16)
    w = per_block_quant_reference(torch.randn(n, k) * 0.02)
    xq = quant_triton.per_token_group_quant_triton(x)
    plain, _ = dec.fp8_gemm_decode(
        xq, w, out_dtype=torch.float32, config=dec.DecodeConfig(64, 64, 1)
    )
    for bm, ahead, trip in (
        (64, 1, 1),
        (64, 0, 2),
        (64, 1, 2),
        (64, 0, 4),
        (64, 1, 4),
        (128, 1, 2),
    ):
        cfg = dec.DecodeConfig(bm, 64, 1, 4, 3, ahead, trip)
        codes, _ = dec.fp8_gemm_decode(xq, w, out_dtype=torch.float32, config=cfg)
        fused, scales = dec.fp8_gemm_decode(x, w, out_dtype=torch.float32, config=cfg)
        same = torch.equal(codes, plain) and torch.equal(fused, plain)
        print(
            f"loop bm={bm} ahead={ahead} trip={trip} same={same} scales={torch.equal(scales, xq.scale)}"
        )
    # 3 K blocks, the last one overflowing: the partly empty last trip must add 0, not 0 * inf
    x, w = torch.randn(1, 384), torch.randn(64, 384) * 0.02
    x[:, 256:] *= 1e30
    w[:, 256:] *= 1e32
    xq, wq = quant_triton.per_token_group_quant_triton(x), per_block_quant_reference(w)
    for ahead, trip in ((0, 2), (1, 2), (0, 4), (1, 4)):
        cfg = dec.DecodeConfig(64, 64, 1, 4, 3, ahead, trip)
        out, _ = dec.fp8_gemm_decode(xq, wq, out_dtype=torch.float32, config=cfg)
        print(f"overflow ahead={ahead} trip={trip} nan={bool(out.isnan().any())}")
    # 5 K blocks in 4 splits: the last split is empty; K = 0 has no blocks at all
    x, w = torch.randn(17, 640), per_block_quant_reference(torch.randn(64, 640) * 0.02)
    xq = quant_triton.per_token_group_quant_triton(x)
    ref = fp8_gemm_reference(xq, w, out_dtype=torch.float32)
    out, _ = dec.fp8_gemm_decode(xq, w, out_dtype=torch.float32, config=dec.DecodeConfig(64, 64, 4))
    empty, _ = dec.fp8_gemm_decode(
        torch.randn(3, 0), per_block_quant_reference(torch.randn(64, 0)), out_dtype=torch.float32
    )
    err = float((out - ref).abs().max() / ref.abs().max())
    print(f"emptysplit err={err:.2e} k0_zero={bool((empty == 0).all())}")


def fused_cases() -> None:
    torch.manual_seed(1)
    x = torch.randn(5, 384)
    d = torch.randn(5, 384)
    w = torch.rand(384) + 0.5
    res, q = fused_triton.add_rms_norm_quant_triton(x, d, w, 1e-5)
    ref_res, ref_q = fused.add_rms_norm_quant_reference(x, d, w, 1e-5)
    y = w * (res * torch.rsqrt(res.pow(2).mean(-1, keepdim=True) + 1e-5))
    rq = quant_triton.per_token_group_quant_triton(y)
    scale_err = float(((q.scale - ref_q.scale).abs() / ref_q.scale).max())
    codes = float((q.codes.float() != rq.codes.float()).float().mean())
    print(
        f"norm rows={res.shape[0]} residual_same={torch.equal(res, ref_res)} scale_err={scale_err:.2e} codes_diff={codes:.4f}"
    )
    gu = torch.randn(7, 2 * 256) * 3
    q = fused_triton.silu_mul_quant_triton(gu[:, :256], gu[:, 256:])
    ref_q = fused.silu_mul_quant_reference(gu[:, :256], gu[:, 256:])
    rq = quant_triton.per_token_group_quant_triton(
        torch.nn.functional.silu(gu[:, :256]) * gu[:, 256:]
    )
    scale_err = float(((q.scale - ref_q.scale).abs() / ref_q.scale).max())
    codes = float((q.codes.float() != rq.codes.float()).float().mean())
    print(f"silu scale_err={scale_err:.2e} codes_diff={codes:.4f}")


def fused_backward_cases() -> None:
    """The fast RMSNorm / SwiGLU backward kernels against float64 autograd (float32 and float16
    data: the interpreter's bfloat16 cast truncates), several programs and column blocks, the
    SwiGLU halves of one tensor read in place, and through the autograd functions."""
    from fp8rl.kernels import fused_backward_triton as fb

    fb.RMS_PROGRAMS, fb.SILU_BLOCK = 3, (4, 64)
    torch.manual_seed(2)

    def rel(a, r):
        return float((a.double() - r).norm() / r.norm())

    for dt in (torch.float32, torch.float16):
        # 9 rows over 4 programs of 3 rows (the last one idle); x and ∇y with row strides ≠ H
        x, g = (torch.randn(9, 512) * 2).to(dt)[:, :384], torch.randn(9, 3, 384).to(dt)[:, 1]
        w = torch.rand(384) + 0.5
        fb.RMS_PROGRAMS = 4
        dx, dw = fb.rms_norm_backward(x, w, g, 1e-5)
        xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
        (wr * (xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-5))).backward(g.double())
        gate, up = (
            (torch.randn(9, 2 * 200) * 3).to(dt)[:, :200],
            torch.randn(9, 300).to(dt)[:, 50:250],
        )
        d = torch.randn(9, 400).to(dt)[:, ::2]  # no unit stride: copied first
        d_gate, d_up = fb.silu_mul_backward(gate, up, d)
        refs = [gate.double().requires_grad_(), up.double().requires_grad_()]
        (torch.nn.functional.silu(refs[0]) * refs[1]).backward(d.double())
        kind = str(dt).split(".")[1]
        print(
            f"fused_bwd dtype={kind} dx={rel(dx, xr.grad):.2e} dw={rel(dw, wr.grad):.2e} "
            f"dgate={rel(d_gate, refs[0].grad):.2e} dup={rel(d_up, refs[1].grad):.2e} "
            f"dtypes={dx.dtype == dt and dw.dtype == w.dtype and d_gate.dtype == dt}"
        )
    x = torch.randn(3, 5, 256, requires_grad=True)
    w = (torch.rand(256) + 0.5).requires_grad_()
    gu = torch.randn(15, 512, requires_grad=True)
    grads, calls = [], []
    kernels = fb.rms_norm_backward, fb.silu_mul_backward
    for triton_backward in (True, False):  # the kernels, then the recomputed torch composition
        previous = fused.set_triton_backward(triton_backward)
        count = [0]

        def counted(fn, count=count):
            return lambda *a: (count.__setitem__(0, count[0] + 1), fn(*a))[1]

        fb.rms_norm_backward, fb.silu_mul_backward = (counted(k) for k in kernels)
        y = fused._RmsNormFast.apply(x, w, 1e-5)
        h = fused._SiluMulFast.apply(gu[:, :256], gu[:, 256:])
        grads.append(torch.autograd.grad(y.square().sum() + h.square().sum(), (x, w, gu)))
        fb.rms_norm_backward, fb.silu_mul_backward = kernels
        fused.set_triton_backward(previous)
        calls.append(count[0])
    worst = max(rel(a, b.double()) for a, b in zip(*grads, strict=True))
    print(f"fused_bwd_autograd rel={worst:.2e} kernel_calls={calls[0]},{calls[1]}")


def rope_kv_cases() -> None:
    """float32 caches: bitwise the torch composition. FP8 caches: the interpreter's float8 cast
    is not round-to-nearest (it can even drop a carry into the exponent), so only the indexing
    is checked here: unwritten slots stay zero and most written codes equal torch's."""
    torch.manual_seed(2)
    b, length, heads, kv_heads, d, cap = 3, 2, 4, 2, 32, 9
    cos_t, sin_t = rope_table(d, 16, 1.0 / (10000 ** (torch.arange(0, d, 2) / d)))
    positions = torch.tensor([[0, 1], [4, 5], [7, 8]])
    cos, sin = cos_t[positions], sin_t[positions]
    qkv = torch.randn(b, length, (heads + 2 * kv_heads) * d)
    q = qkv[..., : heads * d].view(b, length, heads, d)
    k = qkv[..., heads * d : (heads + kv_heads) * d].view(b, length, kv_heads, d)
    v = qkv[..., (heads + kv_heads) * d :].view(b, length, kv_heads, d)
    caches = [torch.full((b, kv_heads, cap, d), 7.0) for _ in range(4)]
    out = rope_kv_write_triton(q, k, v, cos, sin, positions, caches[0], caches[1], None, None)
    ref = rope_kv_write_reference(q, k, v, cos, sin, positions, caches[2], caches[3])
    same = torch.equal(out, ref) and out.stride() == ref.stride()
    same_cache = torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    scales = torch.tensor(0.01), torch.tensor(0.02)
    fp8 = [torch.zeros(b, kv_heads, cap, d, dtype=torch.float8_e4m3fn) for _ in range(4)]
    rope_kv_write_triton(q, k, v, cos, sin, positions, fp8[0], fp8[1], *scales)
    rope_kv_write_reference(q, k, v, cos, sin, positions, fp8[2], fp8[3], *scales)
    written = caches[2] != 7.0
    equal = [(fp8[i].float() == fp8[i + 2].float())[written].float().mean() for i in (0, 1)]
    untouched = all(bool((c.float()[~written] == 0).all()) for c in fp8[:2])
    print(
        f"rope same={same} cache_same={same_cache} fp8_equal={float(min(equal)):.3f} "
        f"fp8_untouched={untouched}"
    )


def transpose_cases() -> None:
    """FP8 codes (as raw bytes) transposed by the tiled kernel: ragged edges, bitwise."""
    torch.manual_seed(3)
    for rows, cols in [(64, 64), (130, 70), (1, 200), (257, 3)]:
        src = torch.randint(0, 256, (rows, cols), dtype=torch.uint8).view(torch.float8_e4m3fn)
        out = transpose_codes(src)
        same = torch.equal(out.view(torch.uint8), src.view(torch.uint8).t().contiguous())
        print(f"transpose rows={rows} cols={cols} same={same} shape={tuple(out.shape)}")


if __name__ == "__main__":
    transpose_cases()
    decode_gemm_cases()
    decode_loop_variant_cases()
    fused_cases()
    rope_kv_cases()
    fused_backward_cases()
