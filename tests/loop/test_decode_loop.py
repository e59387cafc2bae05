"""The native engine's graph-mode decode loop (rows kept in place, one replay per step with the
draw inside, the host reading step t while step t + 1 runs) gives the eager loop's generations:
same tokens, logprobs and finish reasons. On CPU the captured step is replaced by the same step
run eagerly (``_EagerSteps``); tests/gpu/test_graph_decode_gpu.py replays real CUDA graphs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fp8rl.kernels.invariant import set_fast_attention
from fp8rl.protocol import QuantConfig, SamplingParams
from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.rollout import engine as engine_module
from fp8rl.workers.rollout.cuda_graphs import GraphDecoder, kernel_switches
from fp8rl.workers.rollout.engine import NativeEngine
from fp8rl.workers.rollout.sampling import counter_uniforms, sequence_seed, uniform_table

CONFIG = replace(PRESETS["tiny-llama"], vocab_size=512)
PROMPTS = [[1, 17, 300, 42], [1, 5], [1, 200, 201, 202, 203, 204, 205], [1, 77, 78]]
EOS = list(range(0, CONFIG.vocab_size, 16))  # ~1 in 16 draws ends a row: mixed lengths


class _EagerSteps(GraphDecoder):
    """GraphDecoder's step (forward, lm_head, draw, logprob) run eagerly, for a CPU test."""

    def __init__(self, model, cache, batch, sampling):
        self.model, self.cache, self.sampling = model, cache, sampling
        self.tokens = torch.zeros(batch, dtype=torch.long)
        self.pos = torch.zeros(batch, dtype=torch.long)
        self.uniforms = torch.zeros(batch, dtype=torch.float64)
        self.switches = kernel_switches()
        self.calls = 0

    def __call__(self, tokens, pos, uniforms, limit):
        self.tokens.copy_(tokens), self.pos.copy_(pos), self.uniforms.copy_(uniforms)
        self.calls += 1
        return self._step(limit)


def _generate(model, sampling, *, graphs: bool, monkeypatch):
    engine = NativeEngine(model, eos_token_ids=EOS, max_batch_size=16)
    made = []

    def factory(*args):
        made.append(_EagerSteps(*args))
        return made[-1]

    monkeypatch.setattr(engine_module, "GraphDecoder", factory)
    engine.cuda_graphs = graphs
    out = engine.generate(PROMPTS, sampling)
    return out, sum(m.calls for m in made)


def test_a_uniform_table_column_is_bitwise_the_per_step_uniform():
    seeds = torch.tensor([sequence_seed(3, i) for i in range(6)] + [2**62 - 1, 0])
    table = uniform_table(seeds, 40)
    assert table.shape == (8, 40) and table.dtype == torch.float64
    for step in (0, 1, 17, 39):
        assert torch.equal(table[:, step], counter_uniforms(seeds, step))
    narrow = counter_uniforms(seeds[:, None], torch.arange(40, dtype=torch.int32))
    assert torch.equal(narrow, table)  # int32 steps: the same numbers (no 32-bit overflow)


@pytest.mark.parametrize(
    ("mode", "top_k", "top_p", "temperature"),
    [("bf16", 0, 1.0, 1.0), ("unified_fp8", 20, 0.9, 0.8), ("bf16", 0, 1.0, 0.0)],
)
def test_graph_mode_loop_gives_the_eager_loops_generations(
    mode, top_k, top_p, temperature, monkeypatch
):
    fp8 = mode == "unified_fp8"
    precision = LayerPrecision(
        dtype=torch.bfloat16, fp8=fp8, quant=QuantConfig() if fp8 else None, exact=True,
        trainable=False,
    )  # fmt: skip
    model = build_decoder(
        CONFIG, precision, state_dict=None, max_positions=64, param_dtype=torch.bfloat16, seed=3
    )
    sampling = SamplingParams(
        n=2, max_tokens=40, temperature=temperature, top_k=top_k, top_p=top_p, seed=5
    )
    eager, _ = _generate(model, sampling, graphs=False, monkeypatch=monkeypatch)
    graph, steps = _generate(model, sampling, graphs=True, monkeypatch=monkeypatch)
    flat = [g for group in eager for g in group]
    lengths = {len(g.token_ids) for g in flat}
    if temperature > 0:  # the EOS set must cut rows at different steps (compaction exercised)
        assert len(lengths) > 2 and {g.finish_reason for g in flat} == {"stop", "length"}
    assert steps <= max(lengths)  # stopped at most one step after the last row finished
    for eg, gg in zip(eager, graph, strict=True):
        for e, g in zip(eg, gg, strict=True):
            assert g.token_ids == e.token_ids
            assert g.logprobs == e.logprobs
            assert g.finish_reason == e.finish_reason


def test_kept_graphs_serve_the_next_call_of_their_shape_and_are_replaced_for_another(monkeypatch):
    precision = LayerPrecision(dtype=torch.bfloat16, fp8=False, exact=True, trainable=False)
    model = build_decoder(
        CONFIG, precision, state_dict=None, max_positions=64, param_dtype=torch.bfloat16, seed=3
    )
    made = []

    def factory(*args):
        made.append(_EagerSteps(*args))
        return made[-1]

    monkeypatch.setattr(engine_module, "GraphDecoder", factory)

    def engine():
        e = NativeEngine(model, eos_token_ids=EOS, max_batch_size=16)
        e.cuda_graphs = True
        return e

    def sampling(**kw):
        return SamplingParams(**{"n": 2, "max_tokens": 20, "temperature": 1.0, "seed": 5, **kw})

    kept = engine()
    kept.generate(PROMPTS, sampling())
    second = kept.generate(PROMPTS[::-1], sampling(seed=9))  # same rows and capacity
    assert len(made) == 1
    fresh = engine().generate(PROMPTS[::-1], sampling(seed=9))
    assert len(made) == 2
    for a, b in zip(second, fresh, strict=True):  # the reused cache holds this call's prompts
        assert [g.token_ids for g in a] == [g.token_ids for g in b]
        assert [g.logprobs for g in a] == [g.logprobs for g in b]
    kept.generate(PROMPTS, sampling(temperature=0.7))  # another captured sampling: new graphs
    kept.generate(PROMPTS[:2], sampling(temperature=0.7))  # fewer rows: new graphs
    assert len(made) == 4 and kept._graphs is made[-1]
    kept.drop_graphs()
    kept.generate(PROMPTS[:2], sampling(temperature=0.7))
    assert len(made) == 5
    previous = set_fast_attention("sdpa")  # a kernel switch the graphs baked in
    try:
        kept.generate(PROMPTS[:2], sampling(temperature=0.7))
    finally:
        set_fast_attention(previous)
    assert len(made) == 6
