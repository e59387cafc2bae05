"""A rank of the two-process (gloo) Megatron tests: build, load, score, publish, backward."""

from __future__ import annotations

import warnings

import torch
from megatron_configs import TP2_LLAMA, hf_state

from fp8rl.protocol import QuantConfig
from fp8rl.workers.model.linear import LayerPrecision

DENSE_FP32 = LayerPrecision(dtype=torch.float32, exact=True)
"""Dense float32 compute: TP changes only the summation order, so scores agree to ~1e-6."""


def precisions(exact: bool) -> tuple[LayerPrecision, LayerPrecision]:
    """(trainer, receiver) precisions of unified_fp8 with an FP8 lm_head."""
    quant = QuantConfig(bf16_modules=["embed_tokens"])
    trainer = LayerPrecision(dtype=torch.bfloat16, fp8=True, quant=quant, exact=exact)
    receiver = LayerPrecision(dtype=torch.bfloat16, fp8=True, quant=quant, trainable=False)
    return trainer, receiver


def run_rank(rank: int, world: int, tp: int, pp: int, sp: bool, port: int, batch, out: str) -> None:
    """One rank: results of rank 0 are saved to ``out`` (torch.save). ``sp``: the dense float32
    model runs sequence parallel."""
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    from fp8rl.workers.trainer.megatron.model import build_gpt_model, load_hf_weights
    from fp8rl.workers.trainer.megatron.parallel import init_parallel, shutdown_parallel
    from fp8rl.workers.trainer.megatron.publish import megatron_update

    init_parallel(rank=rank, world=world, tp=tp, pp=pp, address="127.0.0.1", port=port)
    try:
        trainer, receiver = precisions(exact=True)
        model = build_gpt_model(TP2_LLAMA, trainer, max_positions=64)
        load_hf_weights(model, hf_state(TP2_LLAMA))
        result = {}
        _, payload = megatron_update(model, receiver=receiver, version=1, fingerprint="f")
        result["payload"] = payload
        if pp == 1:
            from fp8rl.workers.trainer.megatron.logprobs import response_logprobs

            with torch.no_grad():
                result["logprobs"] = response_logprobs(model, batch, temperature=1.0)
            dense = build_gpt_model(TP2_LLAMA, DENSE_FP32, max_positions=64, sequence_parallel=sp)
            load_hf_weights(dense, hf_state(TP2_LLAMA))
            logp = response_logprobs(dense, batch, temperature=1.0)
            (-(logp * batch.response_mask).sum()).backward()
            result["dense_logprobs"] = logp.detach()
            result["fc1_grad"] = dense.decoder.layers[0].mlp.linear_fc1.weight.grad.clone()
            result["qkv_grad"] = dense.decoder.layers[
                1
            ].self_attention.linear_qkv.weight.grad.clone()
        if rank == 0:
            torch.save(result, out)
    finally:
        shutdown_parallel()
