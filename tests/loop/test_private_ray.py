"""Clean exits (issue 17 row 12): a private Ray head is stopped by its watchdog when the driver
is killed with SIGKILL, every process of the head's session included; a Ctrl-C while the head
starts stops it too; Ray's token file is 0600."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fp8rl.services import private_ray, ray_head
from fp8rl.services.private_ray import make_token_private, session_members

# A stand-in head (argv: its temp dir): leads its own session, records itself there as
# `ray_head` does, has a child in the process group and one that left the group (as Ray's
# agents can), all sleeping.
FAKE_HEAD = """
import os, subprocess, sys, time
from fp8rl.services.ray_head import claim_head
if claim_head(sys.argv[1], os.getpid()) != os.getpid():
    sys.exit(1)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
subprocess.Popen([sys.executable, "-c", "import os, time; os.setpgrp(); time.sleep(600)"])
time.sleep(600)
"""


def _wait(predicate, timeout_s: float) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"not within {timeout_s} s")
        time.sleep(0.05)
    return time.monotonic() - start


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_watchdog_stops_the_whole_head_session_when_the_driver_is_killed(tmp_path):
    temp_dir = tmp_path / "fp8rl-ray-x"
    temp_dir.mkdir()
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    watchdog = _watchdog(driver.pid, temp_dir)
    head = subprocess.Popen([sys.executable, "-c", FAKE_HEAD, temp_dir], start_new_session=True)
    try:
        _wait(lambda: len(session_members(head.pid)) == 3, timeout_s=30)
        time.sleep(1.0)  # the watchdog is up and polling
        driver.kill()
        driver.wait()
        head.wait(timeout=30)  # our child: reap it so it does not linger as a zombie
        elapsed = _wait(lambda: not session_members(head.pid), timeout_s=20)
        _wait(lambda: not temp_dir.exists(), timeout_s=5)
        assert watchdog.wait(timeout=10) == 0
        print(f"head session cleaned {elapsed:.2f} s after the driver's SIGKILL")
    finally:
        _kill_all([driver.pid, watchdog.pid, *session_members(head.pid)])


def _watchdog(driver_pid: int, temp_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fp8rl.services.private_ray", str(driver_pid), str(temp_dir)],
        start_new_session=True,
    )


def test_watchdog_leaves_the_head_alone_while_the_driver_lives(tmp_path):
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    watchdog = _watchdog(driver.pid, tmp_path)
    head = subprocess.Popen([sys.executable, "-c", FAKE_HEAD, tmp_path], start_new_session=True)
    try:
        time.sleep(2.0)
        assert head.poll() is None and watchdog.poll() is None
    finally:
        _kill_all([driver.pid, watchdog.pid, *session_members(head.pid)])
        head.wait()


def test_ctrl_c_while_the_head_starts_stops_it_and_removes_its_temp_dir(tmp_path, monkeypatch):
    """The leak of the new-user test: a Ctrl-C inside ``start_local_ray`` (``ray start`` bringing
    the head up, before any shutdown hook exists) left the whole head running under init."""
    started: dict[str, object] = {}

    def interrupted_start(log_path, *, temp_dir, num_cpus, dashboard):
        head = subprocess.Popen([sys.executable, "-c", FAKE_HEAD, temp_dir], start_new_session=True)
        started.update(head=head, temp_dir=temp_dir)
        _wait(lambda: len(session_members(head.pid)) == 3, timeout_s=30)  # half-way up
        raise KeyboardInterrupt

    monkeypatch.setattr(private_ray.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(private_ray, "start_local_ray", interrupted_start)
    head = None
    try:
        with pytest.raises(KeyboardInterrupt):
            private_ray.start_private_ray()
        head = started["head"]
        assert head.wait(timeout=5) != 0  # stopped, not left running
        assert not session_members(head.pid)
        assert not Path(started["temp_dir"]).exists()
        assert not list(tmp_path.iterdir())  # nor the watchdog's dir
    finally:
        if head is not None:
            _kill_all(session_members(head.pid))


def test_a_head_called_off_before_it_starts_starts_nothing(tmp_path, monkeypatch):
    """The driver died before its ``ray start`` ran: the watchdog calls the head off, and the
    late ``ray start`` exits 1 without importing Ray."""
    driver = subprocess.Popen([sys.executable, "-c", "pass"])
    driver.wait()
    temp_dir = tmp_path / "fp8rl-ray-x"
    temp_dir.mkdir()
    assert private_ray.main([str(driver.pid), str(temp_dir)]) == 0
    assert not temp_dir.exists()
    monkeypatch.setitem(sys.modules, "ray._private.services", None)  # importing it would fail
    monkeypatch.setitem(sys.modules, "ray.scripts.scripts", None)
    assert ray_head.main(["--head", f"--temp-dir={temp_dir}"]) == 1
    temp_dir.mkdir()  # called off by a stopper that has not removed the dir yet
    assert ray_head.claim_head(temp_dir, ray_head.CALLED_OFF) == ray_head.CALLED_OFF
    assert ray_head.main(["--head", f"--temp-dir={temp_dir}"]) == 1


def test_the_first_claim_on_a_head_stands(tmp_path):
    """A head that claimed first is stopped by its session id; one called off first never runs."""
    assert ray_head.claim_head(tmp_path, 4242) == 4242
    assert ray_head.claim_head(tmp_path, ray_head.CALLED_OFF) == 4242
    assert ray_head.claim_head(tmp_path / "gone", 4243) == ray_head.CALLED_OFF
    assert [p.name for p in tmp_path.iterdir()] == [ray_head.LEADER_FILE]  # no drafts left


def test_ray_token_file_is_made_private(tmp_path, monkeypatch):
    token = tmp_path / "auth_token"
    token.write_text("secret\n")
    token.chmod(0o644)  # as Ray writes it
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    assert make_token_private() == token
    assert token.stat().st_mode & 0o777 == 0o600


REAL_DRIVER = """
import os, sys, time
import ray
from fp8rl.services import runtime

runtime.init_ray(None)  # no cluster around: a private head with its watchdog

@ray.remote(num_cpus=0)
def pid():
    return os.getpid()

print(ray.get(pid.remote()), os.getsid(ray.get(pid.remote())), flush=True)
time.sleep(60)
"""


@pytest.fixture
def short_tmp():
    """A short temp dir (Ray puts unix sockets under it: paths must stay under 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="f8"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_killed_driver_leaves_no_ray_process_behind(short_tmp):
    # RAY_TMPDIR: no ray_current_cluster of another Ray on this machine is found
    env = {**os.environ, "TMPDIR": str(short_tmp), "RAY_TMPDIR": str(short_tmp)}
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.Popen(
        [sys.executable, "-c", REAL_DRIVER], stdout=subprocess.PIPE, text=True, env=env
    )
    session = None
    try:
        worker_pid, session = map(int, driver.stdout.readline().split())
        assert worker_pid in session_members(session)  # Ray's workers live in the head's session
        driver.kill()
        driver.wait()
        elapsed = _wait(lambda: not session_members(session), timeout_s=60)
        print(f"Ray cleaned {elapsed:.2f} s after the driver's SIGKILL")
        _wait(lambda: not list(short_tmp.glob("fp8rl-ray-*")), timeout_s=10)  # its temp dir too
    finally:
        _kill_all([driver.pid, *(session_members(session) if session else [])])


def test_ctrl_c_while_a_real_head_starts_leaves_no_ray_process_behind(short_tmp):
    """The new-user test's repro on a real Ray: SIGINT while `ray start` brings the driver's
    private head up (it leaked gcs_server, raylet and the agents, ~0.4 GB, and the temp dir)."""
    env = {**os.environ, "TMPDIR": str(short_tmp), "RAY_TMPDIR": str(short_tmp)}
    env.pop("RAY_ADDRESS", None)
    script = "from fp8rl.services import runtime; runtime.init_ray(None); input()"
    driver = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, env=env)
    leader = None
    try:
        _wait(lambda: list(short_tmp.glob("fp8rl-ray-*/head.leader")), timeout_s=120)
        leader = int(next(short_tmp.glob("fp8rl-ray-*/head.leader")).read_text())
        driver.send_signal(signal.SIGINT)  # `ray start` is starting the head's processes
        start = time.monotonic()
        driver.wait(timeout=60)
        elapsed = time.monotonic() - start
        assert not session_members(leader)
        assert not list(short_tmp.glob("fp8rl-ray-*"))
        assert elapsed < 8.0  # stopped in Ray's order, not after the 10 s grace period
        print(f"driver gone {elapsed:.2f} s after SIGINT, its head with it")
    finally:
        _kill_all([driver.pid, *(session_members(leader) if leader else [])])


def test_private_head_runs_without_the_dashboard(short_tmp, monkeypatch):
    """``fp8rl run``'s head talks to the driver through the GCS only: no dashboard processes
    (~10 of them, ~0.3 GB, issue 18), yet a driver connects and runs a task."""
    import ray

    from fp8rl.services.private_ray import start_private_ray

    monkeypatch.setenv("TMPDIR", str(short_tmp))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    private = start_private_ray(num_cpus=1)
    try:
        assert private.head.dashboard_url == ""
        commands = []
        for pid in session_members(private.head.pid):
            with contextlib.suppress(OSError):
                commands.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" "))
        assert any(b"gcs_server" in c for c in commands), commands
        assert not [c for c in commands if b"ray-dashboard-" in c]  # the dashboard's modules
        # what Ray keeps without a dashboard: one process serving usage stats only
        heads = [c for c in commands if b"dashboard/dashboard.py" in c]
        assert all(b"--modules-to-load=UsageStatsHead" in c for c in heads), heads
        assert not [c for c in commands if b"autoscaler/_private/monitor.py" in c]
        ray.init(address=private.head.gcs_address)
        assert ray.get(ray.remote(lambda: 41 + 1).remote()) == 42
    finally:
        ray.shutdown()
        private.stop()


def test_private_head_has_no_client_server_and_no_blocking_ray_start(short_tmp, monkeypatch):
    """Issue 18: neither Ray's client server (0.05 GB) nor a ``ray start --block`` process
    (0.14 GB) waits beside the head; its processes live in the session of the exited ``ray
    start``, and ``stop`` ends every one of them and removes the head's temp dir."""
    import ray

    from fp8rl.services.private_ray import start_private_ray

    monkeypatch.setenv("TMPDIR", str(short_tmp))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    private = start_private_ray(num_cpus=1)
    try:
        assert not Path(f"/proc/{private.head.pid}").exists()  # `ray start` has returned
        commands = []
        for pid in session_members(private.head.pid):
            with contextlib.suppress(OSError):
                commands.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" "))
        assert any(b"raylet" in c for c in commands), commands
        assert not [c for c in commands if b"ray.util.client.server" in c]
        assert not [c for c in commands if b"--block" in c or b" start " in c]
        ray.init(address=private.head.gcs_address)
        assert ray.get(ray.remote(lambda: 6 * 7).remote()) == 42
    finally:
        ray.shutdown()
        private.stop()
    assert not session_members(private.head.pid)
    assert not Path(private.head.temp_dir).exists()
