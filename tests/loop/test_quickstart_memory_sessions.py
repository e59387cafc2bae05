"""benchmarks/quickstart_memory.py keeps counting the processes of a session a descendant led
after that leader exits (the private Ray head: ``ray start`` returns and its processes are
orphaned), so the quickstart's peak includes the trainer and the engine."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest
from fp8rl_testing import REPO

# The run's stand-in: starts a session leader that starts a worker, then the leader exits and
# is reaped (as ``start_local_ray`` reaps ``ray start``).
RUN = """
import subprocess, sys, time
leader = subprocess.Popen([sys.executable, "-c", '''
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
time.sleep(1.5)
'''], start_new_session=True)
leader.wait()
time.sleep(600)
"""


def _benchmark():
    spec = importlib.util.spec_from_file_location(
        "quickstart_memory", REPO / "benchmarks" / "quickstart_memory.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_processes_of_a_session_stay_counted_after_its_leader_exits():
    bench = _benchmark()
    run = subprocess.Popen([sys.executable, "-c", RUN])
    sessions: set[int] = set()
    try:
        deadline = time.monotonic() + 20
        while len(bench.descendants(run.pid, sessions)) < 3:  # run, leader, worker
            assert time.monotonic() < deadline, "the stand-in did not start"
            time.sleep(0.05)
        (leader,) = sessions
        while os.path.exists(f"/proc/{leader}") and time.monotonic() < deadline:
            time.sleep(0.05)  # the leader exits; its worker is orphaned (reparented)
        found = bench.descendants(run.pid, sessions)
        assert len(found) == 2 and run.pid in found, found  # the run and the orphaned worker
        (worker,) = set(found) - {run.pid}
        assert os.getsid(worker) == leader
    finally:
        for pid in [*bench.descendants(run.pid, sessions)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        run.wait()
