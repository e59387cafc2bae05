"""trainer.backend=megatron spec fields: TP × PP × DP against num_workers, sequence parallel."""

from __future__ import annotations

import pytest

from fp8rl.protocol import SpecError, parse_job_spec


def test_megatron_layout_derives_data_parallel_from_num_workers():
    job = parse_job_spec(
        "",
        [
            "trainer.backend=megatron",
            "trainer.tensor_parallel_size=2",
            "trainer.pipeline_parallel_size=2",
            "trainer.num_workers=8",
            "trainer.sequence_parallel=true",
        ],
    )
    assert job.trainer.data_parallel_size == 2 and job.trainer.sequence_parallel


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.tensor_parallel_size=4", "trainer.num_workers=6"], "multiple of"),
        (["trainer.sequence_parallel=true"], "sequence_parallel needs tensor_parallel_size > 1"),
    ],
)
def test_inconsistent_megatron_layout_is_refused(overrides, message):
    with pytest.raises(SpecError, match=message):
        parse_job_spec("", ["trainer.backend=megatron", *overrides])


def test_native_trainer_has_no_megatron_fields():
    with pytest.raises(SpecError, match="sequence_parallel"):
        parse_job_spec("", ["trainer.sequence_parallel=true"])
