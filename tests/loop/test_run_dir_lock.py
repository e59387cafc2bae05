"""A second run with the same name never moves a live run's directory aside."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fp8rl.protocol import parse_job_spec
from fp8rl.services.run_dir import RunDirectoryBusy, lock_run_dir


def test_a_second_run_of_the_same_name_is_refused_while_the_first_lives(tmp_path):
    overrides = [f"output_dir={tmp_path}", "name=same"]
    code = (
        "import time; from fp8rl.protocol import parse_job_spec; "
        "from fp8rl.services.run_dir import lock_run_dir; "
        f"lock_run_dir(parse_job_spec('', {overrides!r})); print('locked', flush=True); "
        "time.sleep(120)"
    )
    first = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirectoryBusy, match=f"already running .*pid {first.pid}"):
            lock_run_dir(parse_job_spec("", overrides))
    finally:
        first.kill()
        first.wait()
    assert lock_run_dir(parse_job_spec("", overrides)).name == ".same.lock"  # free once it ended
