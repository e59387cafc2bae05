"""GPU acceptance of issue 14 (was benchmarks/gpu_checks.py, which printed numbers and could not
fail): exact mode stays bitwise between the engine and the trainer forward, fast-mode mismatch
stays small, and CUDA IPC weight sync delivers every tensor with its checksum."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from fp8rl.protocol import ModelSpec, PrecisionSpec, QuantConfig, SamplingParams
from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.model.loading import ModelSource

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
FAST_MISMATCH_BEFORE = {"tiny-llama": 1.00252703, "small-llama": 1.02448287}
"""Fast-mode (unified FP8, exact off) token_mult_prob_error before the issue-14 kernels (H200,
2026-11-29). Issue 14's acceptance: no worse than that. With the split-K decode GEMM on, the
fused engine measured 1.00408 / 1.03437 (worse); with the committed dispatch (decode GEMM off,
the trainer's norm/SiLU on the fused kernels' arithmetic) 1.00000000 on both (2026-12-02). With
the split-KV decode attention on (``decode_attention.set_enabled(True)``, off by default):
1.00255701 / 1.02872759, over both bounds."""


def _measure(preset: str, mode: str, exact: bool, max_tokens: int):
    from fp8rl.services.mismatch import measure_mode

    cfg = PRESETS[preset]
    source = ModelSource(cfg, None, None, f"random:{preset}")
    spec = ModelSpec(path=f"random:{preset}", max_model_len=512)
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, cfg.vocab_size, (int(torch.randint(8, 48, (1,), generator=gen)),),
                      generator=gen).tolist()
        for _ in range(16)
    ]  # fmt: skip
    report = measure_mode(
        source,
        spec,
        PrecisionSpec(mode=mode, exact=exact),
        prompts,
        SamplingParams(n=2, temperature=1.0, max_tokens=max_tokens, seed=0),
        device=torch.device("cuda"),
        batch_size=32,
    )
    return {k.split("/")[1]: v for k, v in report.metrics.items()}


@pytest.mark.parametrize(("preset", "max_tokens"), [("tiny-llama", 128), ("small-llama", 256)])
@pytest.mark.parametrize("mode", ["bf16", "unified_fp8"])
def test_exact_mode_engine_and_trainer_logprobs_are_bitwise_equal(preset, max_tokens, mode):
    metrics = _measure(preset, mode, True, max_tokens)
    assert metrics["abs_dlogp_max"] == 0.0
    assert metrics["token_mult_prob_error"] == 1.0


@pytest.mark.parametrize(("preset", "max_tokens"), [("tiny-llama", 128), ("small-llama", 256)])
def test_fast_unified_fp8_mismatch_is_no_worse_than_before_issue_14(preset, max_tokens):
    metrics = _measure(preset, "unified_fp8", False, max_tokens)
    assert 1.0 <= metrics["token_mult_prob_error"] <= FAST_MISMATCH_BEFORE[preset], metrics


def _receive(handles, queue):
    from fp8rl.workers.weight_sync.checksum import wsum64
    from fp8rl.workers.weight_sync.cuda_ipc import CudaIpcTransport

    got = CudaIpcTransport().receive(None, handles, torch.device("cuda"))
    queue.put({k: wsum64(v) for k, v in got.items()})


def test_cuda_ipc_weight_update_arrives_with_matching_checksums():
    from fp8rl.workers.weight_sync.cuda_ipc import CudaIpcTransport
    from fp8rl.workers.weight_sync.update import build_update

    trainer = build_decoder(
        PRESETS["tiny-llama"],
        LayerPrecision(fp8=True, quant=QuantConfig(), trainable=True),
        state_dict=None,
        max_positions=64,
        param_dtype=torch.float32,
        device="cuda",
    )
    receiver = LayerPrecision(fp8=True, quant=QuantConfig(), trainable=False)
    update, payload = build_update(
        trainer, receiver=receiver, version=1, fingerprint="x", transport="cuda_ipc"
    )
    handles = CudaIpcTransport().send(payload)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_receive, args=(handles, queue))
    proc.start()
    sums = queue.get(timeout=120)
    proc.join(timeout=60)
    expected = {e.name: e.checksum for e in update.tensors}
    assert expected and all(sums.get(name) == value for name, value in expected.items())
