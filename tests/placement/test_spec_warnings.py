"""Settings that run but silently stop learning are flagged by `fp8rl validate` and the driver."""

from __future__ import annotations

import torch
from typer.testing import CliRunner

from fp8rl.protocol import parse_job_spec
from fp8rl.services.cli import app
from fp8rl.services.spec_warnings import bf16_updated_fraction, spec_warnings


def _changed_fraction_by_bf16_rounding(lr: float) -> float:
    """Measured: the fraction of N(0, 0.02²) BF16 weights that w + lr (rounded to BF16) changes."""
    w = (torch.randn(200_000, generator=torch.Generator().manual_seed(0)) * 0.02).bfloat16()
    return ((w.float() + lr).bfloat16() != w).float().mean().item()


def test_bf16_update_fraction_matches_what_rounding_does_to_a_step_of_size_lr():
    for lr in (1e-6, 1e-5, 1e-4):
        assert abs(bf16_updated_fraction(lr) - _changed_fraction_by_bf16_rounding(lr)) < 0.02


def test_bf16_master_with_lr_1e_6_warns_that_about_2_percent_of_weights_move():
    (warning,) = spec_warnings(
        parse_job_spec("", ["trainer.master_dtype=bfloat16", "trainer.lr=1e-6"])
    )
    assert warning.startswith("trainer.master_dtype: bfloat16 with trainer.lr=1e-06")
    assert "about 2%" in warning and "float32" in warning


def test_fp32_master_or_a_large_enough_lr_does_not_warn():
    assert (
        spec_warnings(parse_job_spec("", ["trainer.master_dtype=float32", "trainer.lr=1e-6"])) == []
    )
    assert (
        spec_warnings(parse_job_spec("", ["trainer.master_dtype=bfloat16", "trainer.lr=1e-3"]))
        == []
    )


def test_validate_prints_the_warning(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("trainer: {master_dtype: bfloat16, lr: 1.0e-6}\n")
    result = CliRunner().invoke(app, ["validate", "--no-local", str(spec)])
    assert result.exit_code == 0, result.output
    assert "warning: trainer.master_dtype: bfloat16" in result.output


def test_a_warmup_longer_than_the_run_warns_that_the_lr_is_never_reached():
    (warning,) = spec_warnings(parse_job_spec("", ["trainer.warmup_steps=100", "steps=8"]))
    assert warning.startswith("trainer.warmup_steps: 100 optimizer steps of warmup")
    assert "never reaches trainer.lr (at most 8% of it)" in warning
    assert spec_warnings(parse_job_spec("", ["trainer.warmup_steps=2", "steps=8"])) == []
