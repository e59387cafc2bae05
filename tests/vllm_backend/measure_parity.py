"""Measure vLLM ↔ trainer |Δlogp| (docs/results/vllm-parity.md); not collected by pytest.

    python -m tests.vllm_backend.measure_parity MODE [--model PATH] [--without OP ...] [--stock]

MODE is a precision mode (``unified_fp8`` | ``bf16``). The engine samples ``n`` responses per
prompt (T=1, seeded), the trainer (FP32 master weights, the native TrainerWorker) scores the same
token ids, and the script prints one JSON line: max/mean |Δlogp| against the exact trainer
(float64 log-softmax) and against the trainer's logits reduced in float32 (vLLM's reduction).
``--without`` drops fp8rl ops from the engine (``RMSNorm``, ``SiluAndMul``,
``RotaryEmbedding``, ``attention``) to attribute a difference; ``--stock`` runs plain vLLM (no
fp8rl quantization method, bf16 only) and scores the sampled tokens with vLLM's own kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch


def _strip(ops: list[str]) -> None:
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    load_general_plugins()  # registers fp8rl's ops (once per process); then drop some
    for op in ops:
        if op == "attention":
            AttentionBackendEnum.CPU_ATTN.clear_override()
        else:
            op_registry_oot.pop(op)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--without", nargs="*", default=[])
    parser.add_argument("--stock", action="store_true")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--exact", type=int, default=1)
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    sys.path.insert(0, str(Path(__file__).parent))  # the helpers beside this script
    from vllm_helpers import make_engine, make_trainer, sync, tiny_job

    from fp8rl.kernels.invariant import token_logprobs
    from fp8rl.protocol import Prompt, RolloutRequest, SamplingParams
    from fp8rl.workers.model.scoring import pack, response_hidden, response_logprobs

    job = tiny_job(
        f"model.path={args.model}",
        "model.max_model_len=256",
        f"precision.mode={args.mode}",
        f"precision.exact={'true' if args.exact else 'false'}",
    )
    trainer = make_trainer(job)
    _strip(args.without)
    start = time.time()
    engine = make_engine(job)
    sync(trainer, engine)
    gen = torch.Generator().manual_seed(0)
    prompts = [
        Prompt(
            prompt_id=str(i), token_ids=[1, *torch.randint(3, 49000, (12,), generator=gen).tolist()]
        )
        for i in range(args.prompts)
    ]
    request = RolloutRequest(
        request_id="m",
        prompts=prompts,
        sampling=SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens, seed=11),
    )
    samples = engine.generate(request).samples
    engine_logp = [s.logprobs for s in samples]
    if args.stock:  # plain vLLM scoring the same ids (engine weights are irrelevant here)
        engine_logp = [_stock_score(job, trainer, s) for s in samples]
    batch = pack([s.prompt_token_ids for s in samples], [s.token_ids for s in samples])
    with torch.no_grad():
        exact = response_logprobs(trainer.model, batch, temperature=1.0)
        logits = trainer.model.logits(response_hidden(trainer.model, batch))
        fp32 = token_logprobs(logits, batch.response_ids, temperature=1.0, exact=False)
    got = torch.zeros_like(exact)
    for i, lp in enumerate(engine_logp):
        got[i, : len(lp)] = torch.tensor(lp)
    mask = batch.response_mask
    d_exact, d_fp32 = (got - exact).abs()[mask], (got - fp32).abs()[mask]
    print(
        json.dumps(
            {
                "model": args.model,
                "mode": args.mode,
                "exact": bool(args.exact),
                "without": args.without,
                "stock": args.stock,
                "tokens": int(mask.sum()),
                "max_abs_dlogp": float(d_exact.max()),
                "mean_abs_dlogp": float(d_exact.mean()),
                "max_abs_dlogp_vs_fp32_reduction": float(d_fp32.max()),
                "bitwise_equal_tokens_fp32": float((d_fp32 == 0).float().mean()),
                "seconds": round(time.time() - start, 1),
            }
        )
    )


_STOCK = {}


def _stock_score(job, trainer, sample) -> list[float]:
    """Plain vLLM (its own kernels, bf16) with the trainer's bf16 weights."""
    import json as _json
    import tempfile

    from safetensors.torch import save_file
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    if "llm" not in _STOCK:
        folder = tempfile.mkdtemp()
        config = trainer.source.config
        with open(f"{folder}/config.json", "w") as f:
            _json.dump(config.hf_config(), f)
        state = {
            k: v.detach().to(torch.bfloat16).contiguous()
            for k, v in trainer.model.state_dict().items()
        }
        save_file(state, f"{folder}/model.safetensors")
        _STOCK["llm"] = LLM(
            model=folder, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256,
            distributed_executor_backend="uni", enforce_eager=True, kv_cache_memory_bytes=1 << 28,
        )  # fmt: skip
    ids = sample.prompt_token_ids + sample.token_ids
    out = _STOCK["llm"].generate(
        [TokensPrompt(prompt_token_ids=ids)],
        SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False),
        use_tqdm=False,
    )[0]
    rows = out.prompt_logprobs[len(sample.prompt_token_ids) :]
    return [float(r[t].logprob) for t, r in zip(sample.token_ids, rows, strict=True)]


if __name__ == "__main__":
    main()
