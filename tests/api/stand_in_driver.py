"""Stand-in for ``python -m fp8rl.services.driver SPEC_PATH`` in the API's end-to-end tests.

It does what the real driver does with the run store, without a model: report RUNNING, one
metrics row per step (``STEP_SECONDS`` apart), log lines, honour stop requests by writing a
"checkpoint" file and finishing STOPPED, and finish SUCCEEDED. The spec's ``name`` selects a
misbehaviour: ``crash-…`` raises after step 1 without reporting (the service must mark FAILED
from Ray's state), ``stubborn-…`` ignores stop requests (the service must stop the Ray job).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from fp8rl.protocol import RunState, load_job_spec
from fp8rl.services.store.reporter import reporter_from_env

STEP_SECONDS = 0.25


def main(spec_path: str) -> int:
    spec = load_job_spec(spec_path)
    reporter = reporter_from_env()
    assert reporter is not None, "FP8RL_STORE_URL / FP8RL_RUN_ID not set by the service"
    run_dir = Path(spec.output_dir) / spec.name
    run_dir.mkdir(parents=True, exist_ok=True)
    reporter.started(quant_fingerprint="standin-fp", run_dir=str(run_dir))
    print(f"stand-in driver: {spec.steps} steps into {run_dir}", flush=True)
    for step in range(1, spec.steps + 1):
        time.sleep(STEP_SECONDS)
        reporter.step(
            step, {"reward/mean": step / spec.steps, "loss": float("nan") if step == 2 else 0.5}
        )
        reporter.log(f"step {step} done")
        print(f"step {step}", flush=True)
        if spec.name.startswith("crash"):
            raise RuntimeError("stand-in crash after step 1")
        if reporter.stop_requested() and not spec.name.startswith("stubborn"):
            (run_dir / f"checkpoint-step-{step}").write_text("ok")
            reporter.log(f"stop requested: checkpoint at step {step}")
            reporter.finished(RunState.STOPPED)
            return 0
    reporter.finished(RunState.SUCCEEDED)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
