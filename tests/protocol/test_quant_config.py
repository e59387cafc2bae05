"""QuantConfig fingerprint: canonical, order-insensitive, change-sensitive."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fp8rl.protocol import QuantConfig, parse_job_spec


def test_key_order_does_not_change_the_fingerprint():
    a = parse_job_spec("precision:\n  quant: {scale_format: pow2, bf16_first_blocks: 1}\n")
    b = parse_job_spec("precision:\n  quant: {bf16_first_blocks: 1, scale_format: pow2}\n")
    assert a.precision.quant.fingerprint() == b.precision.quant.fingerprint()


def test_module_list_order_does_not_change_the_fingerprint():
    a = QuantConfig(bf16_modules=["lm_head", "embed_tokens"])
    b = QuantConfig(bf16_modules=["embed_tokens", "lm_head"])
    assert a.fingerprint() == b.fingerprint()


@pytest.mark.parametrize(
    "change",
    [
        {"scale_format": "pow2"},
        {"fp8_max": 440.0},
        {"bf16_modules": ["lm_head"]},
        {"bf16_first_blocks": 1},
        {"bf16_last_blocks": 2},
        {"kv_cache_dtype": "fp8_e4m3"},
    ],
)
def test_any_field_change_changes_the_fingerprint(change):
    base = QuantConfig()
    changed = QuantConfig(**change)
    assert base.fingerprint() != changed.fingerprint()
    assert base.differing_fields(changed) == sorted(change)


def test_unsupported_granularity_is_refused():
    with pytest.raises(ValidationError, match=r"only \(1, 128\)"):
        QuantConfig(activation_group=(1, 64))
    with pytest.raises(ValidationError, match=r"only \(128, 128\)"):
        QuantConfig(weight_block=(64, 64))


def test_fingerprint_is_stable_across_processes():
    import subprocess
    import sys

    code = "from fp8rl.protocol import QuantConfig; print(QuantConfig().fingerprint())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == QuantConfig().fingerprint()
