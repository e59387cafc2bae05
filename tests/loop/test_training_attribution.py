"""``logging.mismatch_attribution_every``: ``mismatch/attrib/*`` logged during training."""

from __future__ import annotations

import json

import pytest

from fp8rl.services.mismatch_attribution import attribution_due


def test_attribution_is_due_every_n_steps_counted_from_one_and_off_at_zero():
    assert [s for s in range(1, 7) if attribution_due(3, s)] == [3, 6]
    assert not any(attribution_due(0, s) for s in range(1, 7))


@pytest.mark.slow
def test_a_run_logs_the_attribution_of_each_ingredient(tmp_path):
    import ray
    from tiny import tiny_job

    from fp8rl.services.driver import run

    job = tiny_job(
        "steps=2", "logging.mismatch_attribution_every=2", f"output_dir={tmp_path}",
        "logging.backends=[jsonl]", "checkpoint.save_final=false",
    )  # fmt: skip
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        run(job)
    finally:
        ray.shutdown()
    rows = [json.loads(x) for x in (tmp_path / job.name / "metrics.jsonl").read_text().splitlines()]
    assert "mismatch/attrib/weights" not in rows[0]  # step 1: not due
    last = rows[1]
    names = ("weights", "activations", "kv_cache", "kernels")
    assert all(last[f"mismatch/attrib/{n}"] >= 0 for n in names)
    assert sum(last[f"mismatch/attrib/{n}_share"] for n in names) == pytest.approx(1.0)
    assert last["mismatch/attrib/fp8_all"] > 0 and last["timing_s/attribution"] > 0
