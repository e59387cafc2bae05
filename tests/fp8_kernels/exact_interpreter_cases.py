"""Run the exact-mode Triton kernels on CPU (TRITON_INTERPRET=1) and print one line per case
(``test_exact_triton_interpreter.py`` checks them). Small tiles are patched in so the shapes
cover several blocks; the GPU's rounding is checked by ``test_exact_triton_gpu.py``."""

from __future__ import annotations

import torch

from fp8rl.kernels import attention_exact_triton as att
from fp8rl.kernels import dense_exact_triton as dense
from fp8rl.kernels import logprob_triton as rows
from fp8rl.kernels.invariant import attention_mask
from fp8rl.kernels.kv import kv_dequantize, kv_quantize

DT = torch.float16  # the interpreter's numpy has no bfloat16 dot


def _reference(q, k, v, mask, scale):
    groups = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(groups, 1)
    v = v.double().repeat_interleave(groups, 1)
    s = (q.double() @ k.transpose(-1, -2)) * scale
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v


def attention_cases() -> None:
    att.BLOCK_M = att.BLOCK_N = 16
    att.DQ_TILES, att.DKDV_TILES = (32, 16, 4, 2), (16, 32, 4, 2)  # unequal: each kernel its own
    torch.manual_seed(0)
    b, h, hkv, length, d = 2, 4, 2, 40, 16
    q = torch.randn(b, h, length, d, dtype=DT)
    k, v = torch.randn(b, hkv, length, d, dtype=DT), torch.randn(b, hkv, length, d, dtype=DT)
    pos = torch.arange(length).expand(b, length)
    mask = attention_mask(pos, torch.tensor([length, 30]), length)
    nvis = mask[:, 0].sum(-1)
    ins = [t.clone().requires_grad_() for t in (q, k, v)]
    out = att.exact_attention(*ins, nvis, scale=d**-0.5)
    ref = _reference(q, k, v, mask, d**-0.5)
    print(f"attn_fwd err={(out.double() - ref).abs().max().item():.3e}")
    same = True
    for capacity in (length, 70):
        kc, vc = (
            torch.zeros(b, hkv, capacity, d, dtype=DT),
            torch.randn(b, hkv, capacity, d, dtype=DT),
        )
        kc[:, :, :length], vc[:, :, :length] = k, v
        for p in (0, 5, 33, length - 1):
            step = att.exact_attention(
                q[:, :, p : p + 1], kc, vc, nvis[:, p : p + 1], scale=d**-0.5
            )
            same &= torch.equal(step, out.detach()[:, :, p : p + 1])
    print(f"attn_decode same={same}")
    # counts past the keys given (int64, non-contiguous) act as the keys given (the kernels clamp)
    qs, kk, vv = (t.clone().requires_grad_() for t in (q[:, :, 25:27], k[:, :, :20], v[:, :, :20]))
    over = torch.tensor([[26], [60]]).expand(b, 2)
    outs = [att.exact_attention(qs, kk, vv, over, scale=d**-0.5)]
    grads = torch.autograd.grad(outs[0].float().sum(), (qs, kk, vv))
    outs.append(att.exact_attention(qs, kk, vv, torch.full((b, 2), 20), scale=d**-0.5))
    grads_in = torch.autograd.grad(outs[1].float().sum(), (qs, kk, vv))
    clamp = torch.equal(*outs) and all(map(torch.equal, grads, grads_in))
    print(f"attn_clamp same={clamp}")
    # an FP8 cache read in place, V dequantized before or after Q·Kᵀ (FP8_KV_LATE_V): the rows
    # of the trainer's kernel over the round-tripped keys, bitwise
    ks, vs = torch.tensor(0.0123), torch.tensor(0.0087)
    kq, vq = kv_quantize(k * 8, ks), kv_quantize(v * 8, vs)
    last = nvis[:, -1:]
    trainer = att.exact_attention(
        q[:, :, -1:], kv_dequantize(kq, ks, DT), kv_dequantize(vq, vs, DT), last, scale=d**-0.5
    )
    default = att.FP8_KV_LATE_V
    for late in (False, True):
        att.FP8_KV_LATE_V = late
        cache = att.exact_attention(
            q[:, :, -1:], kq, vq, last, scale=d**-0.5, k_scale=ks, v_scale=vs
        )
        print(f"attn_fp8_cache_late_v_{late} same={torch.equal(cache, trainer)}")
    att.FP8_KV_LATE_V = default
    g = torch.randn_like(out)
    (out.float() * g.float()).sum().backward()
    ref_ins = [t.double().requires_grad_() for t in (q, k, v)]
    (_reference(*ref_ins, mask, d**-0.5) * g.double()).sum().backward()
    for name, a, r in zip(("dq", "dk", "dv"), ins, ref_ins, strict=True):
        err = (a.grad.double() - r.grad).abs().max() / r.grad.abs().max()
        print(f"attn_{name} rel={err.item():.3e}")


def dense_cases() -> None:
    dense.GEMM_BLOCK, rows.LSE_BLOCK = (16, 16, 16), 64
    torch.manual_seed(1)
    x, w = torch.randn(37, 40, dtype=DT), torch.randn(70, 40)
    y = dense.exact_dense_gemm(x, w)
    ref = x.double() @ w.to(DT).double().t()
    rows_same = all(torch.equal(dense.exact_dense_gemm(x[i : i + 1], w)[0], y[i]) for i in (0, 36))
    print(
        f"gemm err={((y.double() - ref).abs().max() / ref.abs().max()).item():.3e} same={rows_same}"
    )
    logits, tok = torch.randn(7, 150), torch.randint(0, 150, (7,))
    lp = rows.exact_token_logprobs(logits, tok, temperature=0.7)
    ref = torch.log_softmax(logits.double() / 0.7, -1).gather(-1, tok[:, None])[:, 0]
    one = rows.exact_token_logprobs(logits[3:4], tok[3:4], temperature=0.7)
    print(
        f"logprob err={(lp.double() - ref).abs().max().item():.3e} same={torch.equal(one[0], lp[3])}"
    )
    g = torch.randn(7)
    ref_in = logits.double().requires_grad_()
    ref = torch.log_softmax(ref_in / 0.7, -1).gather(-1, tok[:, None])[:, 0]
    (ref * g.double()).sum().backward()
    for dtype in (torch.float32, DT):  # the gradient comes back in the logits' dtype
        lg = logits.to(dtype).clone().requires_grad_()
        (rows.exact_token_logprobs(lg, tok, temperature=0.7) * g).sum().backward()
        err = (lg.grad.double() - ref_in.grad).abs().max() / ref_in.grad.abs().max()
        print(f"logprob_grad_{str(dtype)[6:]} rel={err.item():.3e} dtype={lg.grad.dtype}")
    g_ent = torch.randn(7)
    ref_in = logits.double().requires_grad_()
    ref_logp = torch.log_softmax(ref_in / 0.7, -1)
    ref_ent = -(ref_logp.exp() * ref_logp).sum(-1)
    (
        ref_logp.gather(-1, tok[:, None])[:, 0] * g.double() + ref_ent * g_ent.double()
    ).sum().backward()
    lg = logits.clone().requires_grad_()
    both, ent = rows.token_logprobs_entropy(lg, tok, temperature=0.7)
    (both * g + ent * g_ent).sum().backward()
    ent_err = (ent.double() - ref_ent).abs().max()
    grad_err = (lg.grad.double() - ref_in.grad).abs().max() / ref_in.grad.abs().max()
    same = torch.equal(both, lp)
    print(f"entropy err={ent_err.item():.3e} grad_rel={grad_err.item():.3e} logp_same={same}")
    outside = rows.exact_token_logprobs(logits[:2], torch.tensor([150, -1]), temperature=1.0)
    peaked = torch.full((1, 150), -30.0)
    peaked[0, 7] = 30.0
    _, one_hot = rows.token_logprobs_entropy(peaked, torch.tensor([7]), temperature=1.0)
    print(f"edges outside_nan={bool(outside.isnan().all())} one_hot_entropy={one_hot.item():.3e}")


if __name__ == "__main__":
    attention_cases()
    dense_cases()
