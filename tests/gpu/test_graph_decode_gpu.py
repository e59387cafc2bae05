"""CUDA-graph decode (the whole step captured: forward, lm_head, draw, logprob; the host reading
step t while step t + 1 runs) gives the eager engine's generations bitwise on the GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fp8rl.protocol import QuantConfig, SamplingParams
from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.rollout.engine import NativeEngine
from fp8rl.workers.rollout.sampling import (
    counter_uniforms,
    draw,
    inverse_cdf_sample,
    sequence_seed,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
CONFIG = replace(PRESETS["small-llama"], num_hidden_layers=2)


def _generate(model, sampling, eos, graphs: bool):
    engine = NativeEngine(model, eos_token_ids=eos, max_batch_size=64, cuda_graphs=graphs)
    gen = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(3, CONFIG.vocab_size, (int(torch.randint(4, 40, (1,), generator=gen)),),
                      generator=gen).tolist()
        for _ in range(12)
    ]  # fmt: skip
    return [g for group in engine.generate(prompts, sampling) for g in group]


@pytest.mark.parametrize(
    ("mode", "exact", "stop", "top_p"),
    [
        ("bf16", True, True, 0.95),  # filtered: the torch draw
        ("unified_fp8", True, True, 1.0),  # unfiltered: the one-kernel draw
        ("unified_fp8", False, False, 1.0),
        ("bf16", False, False, 0.95),
    ],
)
def test_graph_decode_gives_the_eager_engines_tokens_and_logprobs(mode, exact, stop, top_p):
    fp8 = mode == "unified_fp8"
    precision = LayerPrecision(
        dtype=torch.bfloat16, fp8=fp8, quant=QuantConfig() if fp8 else None, exact=exact,
        trainable=False,
    )  # fmt: skip
    model = build_decoder(
        CONFIG, precision, state_dict=None, max_positions=512, param_dtype=torch.bfloat16,
        device="cuda", seed=0,
    )  # fmt: skip
    # exact mode is batch invariant, so the eager engine's compaction keeps its bits: stop rows
    # early there; fast mode runs every row to the end (same batch in both engines)
    eos = list(range(0, CONFIG.vocab_size, 40)) if stop else []
    sampling = SamplingParams(n=2, max_tokens=300, temperature=1.0, top_p=top_p, seed=3)
    eager = _generate(model, sampling, eos, graphs=False)
    graph = _generate(model, sampling, eos, graphs=True)
    if stop:
        assert len({len(g.token_ids) for g in eager}) > 3  # rows cut at different steps
    assert [g.token_ids for g in graph] == [g.token_ids for g in eager]
    assert [g.logprobs for g in graph] == [g.logprobs for g in eager]
    assert [g.finish_reason for g in graph] == [g.finish_reason for g in eager]


def test_the_one_kernel_draw_follows_the_torch_draw_at_a_real_vocabulary():
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(256, 128256, device="cuda", generator=gen).mul(4).bfloat16()
    logits[:, 1000:2000] = float("-inf")
    u = counter_uniforms(torch.tensor([sequence_seed(5, i) for i in range(256)]), 0).cuda()
    for t in (1.0, 0.6):
        got = draw(logits, u, temperature=t)
        ref = inverse_cdf_sample(torch.softmax(logits.float() / t, -1), u)
        assert int((got == ref).sum()) >= 254  # boundary flips only (see kernels.sample_triton)
        assert not ((got >= 1000) & (got < 2000)).any()
    probs = torch.tensor([0.2, 0.0, 0.5, 0.3], device="cuda")
    n = 200_000
    u = counter_uniforms(torch.tensor([sequence_seed(9, i) for i in range(n)]), 0).cuda()
    freq = torch.bincount(draw(probs.log().expand(n, 4), u, temperature=1.0), minlength=4) / n
    assert freq[1] == 0
    assert torch.allclose(freq.cpu(), torch.tensor([0.2, 0.0, 0.5, 0.3]), atol=0.005)


@pytest.mark.parametrize("kv_fp8", [False, True])
def test_kept_graphs_decode_with_the_weights_of_the_moment(kv_fp8):
    """Graphs kept from an earlier ``generate`` read weights updated in place since then."""
    precision = LayerPrecision(
        dtype=torch.bfloat16, fp8=True, quant=QuantConfig(), exact=False, trainable=False,
        kv_fp8=kv_fp8,
    )  # fmt: skip

    def build(seed):
        model = build_decoder(
            CONFIG, precision, state_dict=None, max_positions=512, param_dtype=torch.bfloat16,
            device="cuda", seed=seed,
        )  # fmt: skip
        if kv_fp8:
            for layer in model.model.layers:
                layer.self_attn.k_scale.fill_(2.0**-5 * (1 + seed))
                layer.self_attn.v_scale.fill_(2.0**-6 * (1 + seed))
        return model

    model, other = build(0), build(1)
    sampling = SamplingParams(n=2, max_tokens=120, temperature=1.0, seed=3)
    prompts = [[1, 5, 9, 200], [1, 7], [1, 300, 301, 302, 303]]
    engine = NativeEngine(model, eos_token_ids=[], max_batch_size=64, cuda_graphs=True)
    before = engine.generate(prompts, sampling)
    kept = engine._graphs
    with torch.no_grad():  # a weight update: every engine tensor overwritten in place
        for mine, new in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
            mine.copy_(new)
    after = engine.generate(prompts, sampling)
    assert engine._graphs is kept  # no new capture
    fresh = NativeEngine(model, eos_token_ids=[], max_batch_size=64, cuda_graphs=True)
    expected = fresh.generate(prompts, sampling)
    tokens = lambda out: [g.token_ids for group in out for g in group]  # noqa: E731
    assert tokens(after) == tokens(expected) != tokens(before)
    assert [g.logprobs for gr in after for g in gr] == [g.logprobs for gr in expected for g in gr]
