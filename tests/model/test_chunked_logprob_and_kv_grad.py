"""Chunked lm_head + log-softmax equals the unchunked tail (its FP32 head cast once per pass);
FP8 KV cache lets k/v grads flow."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fp8rl.kernels.invariant import token_logprobs
from fp8rl.protocol import parse_job_spec
from fp8rl.workers.algorithms import entropy_from_logits
from fp8rl.workers.common import load_model
from fp8rl.workers.model.logprob import chunked_logprobs


class _CountCasts(TorchDispatchMode):
    """Counts dtype casts (``aten._to_copy``) of tensors of one shape."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.count = tuple(shape), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and tuple(args[0].shape) == self.shape:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _trainer_model(*overrides):
    base = ["model.path=random:tiny-llama", "model.max_model_len=128", "data.max_prompt_tokens=64"]
    job = parse_job_spec("", [*base, "rollout.max_tokens=8", "precision.exact=true", *overrides])
    model, _ = load_model(
        job.model,
        job.precision,
        role="trainer",
        trainable=True,
        param_dtype=torch.float32,
        device=torch.device("cpu"),
        seed=0,
    )
    return model


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_and_grads_are_bitwise_the_unchunked_ones(temperature):
    model = _trainer_model()
    torch.manual_seed(1)
    hidden = torch.randn(3, 7, model.config.hidden_size, dtype=model.compute_dtype)
    tokens = torch.randint(0, model.config.vocab_size, (3, 7))

    def full(h):
        logits = model.logits(h)
        logp = token_logprobs(logits, tokens, temperature=temperature, exact=True)
        return logp, entropy_from_logits(logits.float() / temperature)

    h1 = hidden.clone().requires_grad_(True)
    logp1, ent1 = full(h1)
    (logp1.sum() + ent1.sum()).backward()
    head = model.model.embed_tokens.weight  # tiny-llama ties lm_head to the embedding
    g1 = head.grad.clone()
    model.zero_grad()
    h2 = hidden.clone().requires_grad_(True)
    logp2, ent2 = chunked_logprobs(
        model.logits, h2, tokens, temperature=temperature, exact=True, with_entropy=True, chunk=4
    )
    (logp2.sum() + ent2.sum()).backward()
    assert torch.equal(logp1, logp2)  # the exactness contract: logprobs bitwise
    # entropy is a metric: its sum over the vocabulary is split across CPU threads differently
    # for a chunk than for the whole (measured: last-bit differences with 2 threads)
    torch.testing.assert_close(ent1, ent2, rtol=1e-6, atol=0)
    assert torch.equal(h1.grad, h2.grad)
    # the lm_head weight gradient sums over tokens: chunks regroup that sum of BF16 products
    assert float((g1 - head.grad).norm() / g1.norm()) < 1e-2


def test_chunk_must_be_positive():
    model = _trainer_model()
    with pytest.raises(ValueError, match="chunk must be positive"):
        chunked_logprobs(
            model.logits,
            torch.zeros(2, model.config.hidden_size),
            torch.zeros(2, dtype=torch.long),
            temperature=1.0,
            exact=True,
            chunk=0,
        )


def test_fp8_kv_cache_trainer_gets_nonzero_k_and_v_projection_grads():
    model = _trainer_model("precision.mode=unified_fp8", "precision.quant.kv_cache_dtype=fp8_e4m3")
    for attn in model.modules():
        if getattr(attn, "kv_fp8", False):
            attn.k_scale.fill_(0.01)
            attn.v_scale.fill_(0.01)
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    hidden = model(ids, torch.arange(16).expand(2, 16), torch.tensor([16, 16]))
    hidden.float().pow(2).sum().backward()
    for layer in model.model.layers:
        for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
            assert float(proj.weight.grad.abs().sum()) > 0


def test_chunked_head_casts_the_master_weight_once_and_keeps_the_bits():
    model = _trainer_model("precision.exact=false")  # tiny-llama ties its head to the embedding
    head = model.model.embed_tokens.weight
    assert head.dtype == torch.float32 and model.compute_dtype == torch.bfloat16
    torch.manual_seed(1)
    hidden = torch.randn(3, 7, model.config.hidden_size, dtype=torch.bfloat16)
    tokens = torch.randint(0, model.config.vocab_size, (3, 7))
    results = []
    for make in (lambda: (model.logits, None), model.head):  # per-call casts, then the one
        h = hidden.clone().requires_grad_(True)
        with _CountCasts(head.shape) as casts:
            fn, grad_sum = make()
            assert (grad_sum is None) == (fn == model.logits)  # fast mode: ∇W summed
            logp, entropy = chunked_logprobs(
                fn, h, tokens, temperature=0.7, exact=False, with_entropy=True, chunk=4,
                grad_sum=grad_sum,
            )  # fmt: skip
            (logp.sum() + entropy.sum()).backward()
        results.append((logp, entropy, h.grad, head.grad.clone(), casts.count))
        model.zero_grad()
    per_call, once = results
    chunks = 6  # 21 tokens in chunks of 4
    assert per_call[4] == 2 * chunks + chunks  # forward + recompute casts, one ∇W cast per chunk
    assert once[4] == 1 + chunks  # one cast for the pass; on CPU the ∇W casts stay
    for a, b in zip(per_call[:4], once[:4], strict=True):
        assert torch.equal(a, b)
