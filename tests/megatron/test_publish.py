"""The Megatron trainer publishes the native trainer's WeightUpdate bit for bit (TP = PP = 1)."""

from __future__ import annotations

import pytest
import torch
from megatron_configs import TINY_LLAMA, TINY_QWEN2, hf_state

from fp8rl.protocol import QuantConfig
from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.trainer.megatron.model import build_gpt_model, load_hf_weights
from fp8rl.workers.trainer.megatron.publish import megatron_update
from fp8rl.workers.weight_sync.update import build_update


@pytest.mark.parametrize(
    ("config", "trainer_fp8"),
    [(TINY_QWEN2, True), (TINY_LLAMA, False)],
    ids=["qwen2-unified_fp8", "llama-fp8_rollout"],
)
def test_published_codes_scales_and_manifest_equal_native(single_rank, config, trainer_fp8):
    quant = QuantConfig(bf16_modules=["embed_tokens"])  # an FP8 lm_head too (untied Qwen2)
    trainer = LayerPrecision(
        dtype=torch.bfloat16, fp8=trainer_fp8, quant=quant if trainer_fp8 else None
    )
    receiver = LayerPrecision(dtype=torch.bfloat16, fp8=True, quant=quant, trainable=False)
    hf = hf_state(config)
    native = build_decoder(
        config, trainer, state_dict=hf, max_positions=64, param_dtype=torch.float32
    )
    megatron = build_gpt_model(config, trainer, max_positions=64)
    load_hf_weights(megatron, hf)
    fingerprint = quant.fingerprint()
    expected, expected_payload = build_update(
        native, receiver=receiver, version=3, fingerprint=fingerprint
    )
    update, payload = megatron_update(
        megatron, receiver=receiver, version=3, fingerprint=fingerprint
    )
    assert sorted(payload) == sorted(expected_payload)
    for name, tensor in expected_payload.items():
        assert payload[name].dtype == tensor.dtype, name
        assert torch.equal(payload[name].view(torch.uint8), tensor.view(torch.uint8)), name
    assert sorted(update.tensors, key=lambda e: e.name) == sorted(
        expected.tensors, key=lambda e: e.name
    )
    assert (update.version, update.quant_fingerprint) == (
        expected.version,
        expected.quant_fingerprint,
    )
    assert any(e.role == "fp8_weight" and e.name.endswith("q_proj.weight") for e in update.tensors)
