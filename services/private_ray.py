"""A private Ray head for one driver that leaves nothing behind when the driver dies.

``ray.init(address="local")`` starts Ray's processes from the driver; when the driver is killed
with SIGKILL some of them (the dashboard and runtime-env agents) outlive it. Instead the driver
starts its own head with ``ray start --head`` in a new session (``start_local_ray(dashboard=
False)``, through ``services/ray_head.py``: no dashboard, no client server, and no ``--block``
process: ``ray start`` returns once the node is up and its processes stay in that session) and
a small watchdog process (this module's ``main``), also in its own session, that polls the
driver's pid. When the driver is gone, for any reason, the watchdog stops the head: SIGTERM to
every process of the head's session, SIGKILL to those still there after a grace period, then
removes the head's temp dir. ``stop`` does the same at a normal exit.

Ray's auth-token file (``~/.ray/auth_token`` or ``$RAY_AUTH_TOKEN_PATH``) is made private (0600)
whenever a head is started (``start_local_ray``, also for ``fp8rl serve``): Ray writes it
readable by everyone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fp8rl.services.api.ray_launcher import LocalRay, make_token_private, start_local_ray

__all__ = ["PrivateRay", "make_token_private", "session_members", "start_private_ray", "stop_head"]

log = logging.getLogger("fp8rl.private_ray")

POLL_S = 0.5
"""How often the watchdog checks the driver (the cleanup starts within this after its death)."""


@dataclass
class PrivateRay:
    """A head started for one driver and the pid of its watchdog."""

    head: LocalRay
    watchdog_pid: int

    def stop(self) -> None:
        """Stop the head now (normal exit); the watchdog then exits by itself."""
        stop_head(self.head)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.watchdog_pid, signal.SIGTERM)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.watchdog_pid, 0)


def start_private_ray(*, num_cpus: int | None = None) -> PrivateRay:
    """Start a head for this process and a watchdog that stops it when this process dies.

    The head runs without Ray's dashboard (``start_local_ray(dashboard=False)``).

    The head's temp dir (``/tmp/fp8rl-ray-*``, its log ``head.log`` included) goes with it.

    Raises:
        RuntimeError: the head did not start (the log tail says why).
    """
    # `ray start` turns token auth on when ~/.ray/auth_token exists, but this process's Ray read
    # its mode at import (disabled unless set, as with ray.init("local")): make the head match.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    temp_dir = Path(tempfile.mkdtemp(prefix="fp8rl-ray-"))
    # No dashboard: `fp8rl run` talks to the GCS only (ray.init), and the dashboard's ~10
    # processes would cost ~0.3 GB of a small machine (jobs are submitted to `fp8rl serve`'s head).
    head = start_local_ray(
        temp_dir / "head.log", temp_dir=temp_dir, num_cpus=num_cpus, dashboard=False
    )
    watchdog = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fp8rl.services.private_ray",
            str(os.getpid()),
            str(head.pid),
            head.temp_dir,
        ],
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # a SIGKILL of the driver's group must not take the watchdog
    )
    log.info(
        "private Ray head %s (pid %d), watchdog pid %d", head.gcs_address, head.pid, watchdog.pid
    )
    return PrivateRay(head, watchdog.pid)


def stop_head(head: LocalRay, *, grace_s: float = 10.0) -> None:
    """SIGTERM to every process of the head's session (``head.pid`` is its id), SIGKILL to those
    left after ``grace_s``, then remove the head's temp dir.

    The session, not the pid: the ``ray start`` that led it has exited (a private head runs
    without ``--block``), and its pid may since belong to another process.
    """
    _signal_all(session_members(head.pid), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while session_members(head.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal_all(session_members(head.pid), signal.SIGKILL)
    if head.temp_dir:
        shutil.rmtree(head.temp_dir, ignore_errors=True)


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def session_members(session_id: int) -> list[int]:
    """Pids of live processes whose session id is ``session_id`` (Linux ``/proc``)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if int(fields[3]) == session_id and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    """``python -m fp8rl.services.private_ray DRIVER_PID HEAD_PID TEMP_DIR``: the watchdog."""
    driver, head_pid, temp_dir = int(argv[0]), int(argv[1]), argv[2]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the driver stopped the head itself
    while _alive(driver) and session_members(head_pid):  # ~1 ms a scan of /proc
        time.sleep(POLL_S)
    if session_members(head_pid):
        stop_head(LocalRay("", "", head_pid, temp_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
