"""The quant handshake: the driver refuses workers that quantize differently, naming the fields."""

from __future__ import annotations

import pytest

from fp8rl.protocol import Handshake, PrecisionSpec, QuantConfig
from fp8rl.services.runtime import QuantContractError, check_handshakes


def _report(
    role,
    precision: PrecisionSpec,
    *,
    quant: QuantConfig | None = None,
    fp8: bool | None = None,
    exact: bool | None = None,
    rank: int = 0,
) -> Handshake:
    fp8 = (
        (precision.rollout_fp8 if role == "rollout" else precision.trainer_fp8)
        if fp8 is None
        else fp8
    )
    quant = (quant or precision.quant) if fp8 else None
    return Handshake(
        role=role,
        rank=rank,
        precision_mode=precision.mode,
        fp8=fp8,
        quant=quant,
        quant_fingerprint=quant.fingerprint() if quant else None,
        kernel_backend="cpu-emulation",
        exact=precision.exact if exact is None else exact,
        device="cpu",
    )


def test_matching_workers_pass():
    p = PrecisionSpec(mode="unified_fp8")
    assert (
        check_handshakes([_report("trainer", p), _report("rollout", p), _report("reference", p)], p)
        == []
    )


def test_rollout_with_other_scale_format_is_refused_naming_the_field():
    p = PrecisionSpec(mode="unified_fp8")
    other = QuantConfig(scale_format="pow2")
    with pytest.raises(QuantContractError) as info:
        check_handshakes([_report("trainer", p), _report("rollout", p, quant=other)], p)
    assert "differing fields: scale_format" in str(info.value)
    assert "rollout[0]" in str(info.value)


def test_rollout_keeping_other_modules_in_bf16_is_refused():
    p = PrecisionSpec(mode="unified_fp8")
    other = QuantConfig(bf16_modules=["lm_head"], bf16_last_blocks=1)
    with pytest.raises(QuantContractError, match="bf16_last_blocks, bf16_modules"):
        check_handshakes([_report("trainer", p), _report("rollout", p, quant=other, rank=1)], p)


def test_bf16_engine_in_unified_mode_is_refused():
    p = PrecisionSpec(mode="unified_fp8")
    with pytest.raises(QuantContractError, match=r"rollout\[0\] fp8=False"):
        check_handshakes([_report("trainer", p), _report("rollout", p, fp8=False)], p)


def test_exact_flag_mismatch_is_refused():
    p = PrecisionSpec(mode="unified_fp8", exact=True)
    with pytest.raises(QuantContractError, match="exact=False"):
        check_handshakes([_report("trainer", p), _report("rollout", p, exact=False)], p)


def test_fp8_rollout_mode_records_the_bf16_trainer_instead_of_refusing():
    p = PrecisionSpec(mode="fp8_rollout")
    notes = check_handshakes([_report("trainer", p), _report("rollout", p)], p)
    assert notes and "BF16" in notes[0]
