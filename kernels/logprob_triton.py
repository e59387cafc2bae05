"""Token log-probabilities (and entropy) from vocabulary logits, one Triton program per row.

The scoring tail of every policy forward: ``log p(token) = z[token] − logsumexp(z)`` with
``z = logits / T``, and for the trainer's loss the entropy ``H = logsumexp(z) − Σ softmax(z)·z``.
Both engine and trainer score through ``invariant.token_logprobs``, which runs these rows on
CUDA in both precision modes (exact since 2026-12-02, fast since 2026-12-04):

* **Batch-invariant.** One program walks its row's vocabulary in ``LSE_BLOCK`` chunks from 0 with
  a per-lane online max / sum-exp (and Σ e·z for the entropy), then one fixed-shape tree
  reduction: a row's bits depend only on that row, whatever the number of rows.
* **Few bytes.** The forward reads the BF16 row once and writes one float32 (two with the
  entropy); the backward reads it once more and writes ∇logits in the logits' dtype. The torch
  composition it replaced in the fast path (float32 copy, ``log_softmax``, ``gather``; the
  entropy's float32 ``log_softmax``, ``exp``, products) moved ~31 bytes per logit in the
  forward and backward of the log-probability alone; at Llama-3.1-8B's 128,256-entry vocabulary
  and 16K tokens that was ~60 GB per train step (measured cost: not yet, see
  ``benchmarks/train_step.py --tail``).
* **One log-probability.** ``token_logprobs_entropy``'s log-probabilities are the same kernel
  with the entropy accumulator added (``ENTROPY``): its max / sum-exp operations are the same
  sequence, so they equal ``exact_token_logprobs``' bitwise (the GPU tests check it); the
  engine's logprobs need no entropy.

The entropy is computed as ``lse − E[z]`` (float32, clamped at 0): for a peaked row its absolute
error is a few float32 ulps of ``lse`` (~1e-6 nats at |lse| ≈ 30), so an entropy near 0 reads
0, against ``−Σ p log p`` of the torch path (relative error). It is a metric or a loss term,
not part of the parity contract.

Gradients: ``∂ log p(tok)/∂z_i = 1[i = tok] − p_i``; ``∂H/∂z_i = −p_i (z_i − lse + H)``;
``∂/∂logits = ∂/∂z / T`` (float32, rounded once to the logits' dtype).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

LSE_BLOCK, LSE_WARPS = 4096, 8

__all__ = ["exact_token_logprobs", "token_logprobs_entropy"]


@triton.jit(do_not_specialize=["V", "stride"])
def _lse_kernel(
    x_ptr, tok_ptr, out_ptr, lse_ptr, ent_ptr, V, stride, temperature,
    BLOCK: tl.constexpr, ENTROPY: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride
    cols = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], -3.0e38, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    t = tl.zeros([BLOCK], tl.float32)  # Σ e·z per lane (entropy only)
    for start in range(0, V, BLOCK):
        ok = start + cols < V
        x = tl.load(base + start + cols, mask=ok, other=float("-inf")).to(tl.float32) / temperature
        m_new = tl.maximum(m, x)
        rescale = tl.exp(m - m_new)
        e = tl.exp(x - m_new)
        s = s * rescale + e
        if ENTROPY:  # e = 0 for masked lanes and -inf logits: no 0·(-inf)
            t = t * rescale + e * tl.where(e > 0.0, x, 0.0)
        m = m_new
    top = tl.max(m, 0)
    weight = tl.exp(m - top)
    total = tl.sum(s * weight, 0)
    lse = top + tl.log(total)
    tok = tl.load(tok_ptr + row)
    inside = (tok >= 0) & (tok < V)  # an id outside the vocabulary scores NaN, never a stray read
    picked = tl.load(base + tok, mask=inside, other=float("nan")).to(tl.float32) / temperature
    tl.store(out_ptr + row, picked - lse)
    tl.store(lse_ptr + row, lse)
    if ENTROPY:  # lse − E[z] ≥ 0; rounding could make a one-hot row's −ulp
        tl.store(ent_ptr + row, tl.maximum(lse - tl.sum(t * weight, 0) / total, 0.0))


@triton.jit  # the backward need not be invariant: V and the strides specialized (vector loads)
def _lse_grad_kernel(
    x_ptr, tok_ptr, lse_ptr, ent_ptr, g_ptr, g_ent_ptr, dx_ptr, V, stride, grad_stride,
    temperature, BLOCK: tl.constexpr, ENTROPY: tl.constexpr,
):  # fmt: skip
    """∇logits of one row: ``((onehot(tok) − p)·g + (−p·(z − lse + H))·g_H) / T`` in fp32,
    stored in the logits' dtype (one read of the row, one write)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    lse = tl.load(lse_ptr + row)
    tok = tl.load(tok_ptr + row)
    g = tl.load(g_ptr + row).to(tl.float32)
    if ENTROPY:
        ent = tl.load(ent_ptr + row)
        g_ent = tl.load(g_ent_ptr + row).to(tl.float32)
    for start in range(0, V, BLOCK):
        idx = start + cols
        ok = idx < V
        z = tl.load(x_ptr + row * stride + idx, mask=ok, other=0.0).to(tl.float32) / temperature
        p = tl.exp(z - lse)
        grad = (tl.where(idx == tok, 1.0, 0.0) - p) * g
        if ENTROPY:
            grad -= p * tl.where(p > 0.0, z - lse + ent, 0.0) * g_ent
        grad = grad / temperature
        tl.store(dx_ptr + row * grad_stride + idx, grad.to(dx_ptr.dtype.element_ty), mask=ok)


def _rows(logits: Tensor) -> Tensor:
    x = logits.reshape(-1, logits.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, tokens: Tensor, temperature: float, entropy: bool):
        x = _rows(logits)
        tok = tokens.reshape(-1).contiguous()
        out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        lse, ent = torch.empty_like(out), torch.empty_like(out) if entropy else out
        if x.shape[0]:
            _lse_kernel[(x.shape[0],)](
                x, tok, out, lse, ent, x.shape[1], x.stride(0), temperature,
                BLOCK=LSE_BLOCK, ENTROPY=entropy, num_warps=LSE_WARPS,
            )  # fmt: skip
        ctx.save_for_backward(logits, tok, lse, ent if entropy else None)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)
        if not entropy:
            return out.reshape(tokens.shape), None
        return out.reshape(tokens.shape), ent.reshape(tokens.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logp: Tensor | None, grad_ent: Tensor | None):
        logits, tok, lse, ent = ctx.saved_tensors
        x = _rows(logits)
        use_ent = ent is not None and grad_ent is not None
        if grad_logp is None:
            grad_logp = torch.zeros_like(lse)
        g = grad_logp.reshape(-1).contiguous()
        g_ent = grad_ent.reshape(-1).contiguous() if use_ent else g
        grad = torch.empty(x.shape, dtype=logits.dtype, device=x.device)
        if x.shape[0]:
            _lse_grad_kernel[(x.shape[0],)](
                x, tok, lse, ent if use_ent else lse, g, g_ent, grad, x.shape[1], x.stride(0),
                grad.stride(0), ctx.temperature, BLOCK=LSE_BLOCK, ENTROPY=use_ent,
                num_warps=LSE_WARPS,
            )  # fmt: skip
        return grad.reshape(logits.shape), None, None, None


def _check(logits: Tensor, tokens: Tensor, temperature: float) -> None:
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match tokens {tuple(tokens.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (greedy scores at 1.0), got {temperature}")


def exact_token_logprobs(logits: Tensor, tokens: Tensor, *, temperature: float = 1.0) -> Tensor:
    """log p(token) under softmax(logits / temperature), per row in a batch-invariant order.

    Args:
        logits: [..., V] BF16/FP16/FP32 on CUDA (or CPU tensors under ``TRITON_INTERPRET=1``).
        tokens: [...] int64 ids in [0, V) (an id outside scores NaN).
        temperature: > 0 (callers map greedy to 1.0).
    Returns:
        [...] float32; differentiable in logits (∇ in the logits' dtype; once).
    Raises:
        ValueError: the leading shapes differ or ``temperature`` is not positive.
    """
    _check(logits, tokens, temperature)
    return _TokenLogprobs.apply(logits, tokens, float(temperature), False)[0]


def token_logprobs_entropy(
    logits: Tensor, tokens: Tensor, *, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """``(log p(token), entropy)`` of softmax(logits / temperature) in one pass over each row.

    Args: as ``exact_token_logprobs``.
    Returns:
        (logp [...] float32, bitwise ``exact_token_logprobs``'; entropy [...] float32 in nats,
        ≥ 0); both differentiable in logits (module doc for the entropy's precision).
    Raises:
        ValueError: as ``exact_token_logprobs``.
    """
    _check(logits, tokens, temperature)
    return _TokenLogprobs.apply(logits, tokens, float(temperature), True)
