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

The watchdog starts before the head, so no moment of the start is uncovered: a Ctrl-C while
``ray start`` brings the head up (issue: it leaked the whole head, ~0.4 GB) or a SIGKILL of the
driver. The head's session id reaches the watchdog through the head's temp dir
(``ray_head.claim_head``): a head still starting is found there, and one not yet started is
called off. A Ctrl-C during the start also stops the head at once in the driver
(``start_private_ray``), so ``fp8rl run`` returns with nothing left running.

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fp8rl.services.api.ray_launcher import LocalRay, make_token_private, start_local_ray
from fp8rl.services.ray_head import CALLED_OFF, LEADER_FILE, claim_head

__all__ = [
    "PrivateRay",
    "make_token_private",
    "session_members",
    "start_private_ray",
    "stop_head",
    "stop_head_in",
]

log = logging.getLogger("fp8rl.private_ray")

POLL_S = 0.5
"""How often the watchdog checks the driver (the cleanup starts within this after its death)."""

STOP_ORDER: tuple[Callable[[str], bool], ...] = (
    lambda name: name == "raylet",
    lambda name: name != "gcs_server",
    lambda name: True,
)
"""Which processes of a head ``stop_head`` stops, by name, one stage after the other: Ray's own
order (``ray stop``): the raylet, then the rest (agents, workers, log monitor), the GCS last.
All at once, the raylet and the GCS wait for each other until SIGKILL (the whole grace period,
10 s, at every exit); in this order a head stops in ~0.2 s."""


@dataclass
class PrivateRay:
    """A head started for one driver and the pid of its watchdog."""

    head: LocalRay
    watchdog_pid: int

    def stop(self) -> None:
        """Stop the head now (normal exit), then the watchdog."""
        stop_head(self.head)
        _end_watchdog(self.watchdog_pid)


def start_private_ray(*, num_cpus: int | None = None) -> PrivateRay:
    """Start a watchdog that stops the head when this process dies, then the head.

    The head runs without Ray's dashboard (``start_local_ray(dashboard=False)``).

    The head's temp dir (``/tmp/fp8rl-ray-*``, its log ``head.log`` included) goes with it.
    Interrupted (Ctrl-C) or failed, it stops what it started before it raises.

    Raises:
        RuntimeError: the head did not start (the log tail says why).
    """
    # `ray start` turns token auth on when ~/.ray/auth_token exists, but this process's Ray read
    # its mode at import (disabled unless set, as with ray.init("local")): make the head match.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    temp_dir = Path(tempfile.mkdtemp(prefix="fp8rl-ray-"))
    watchdog_pid = None
    try:
        watchdog_pid = _start_watchdog(temp_dir)
        # No dashboard: `fp8rl run` talks to the GCS only (ray.init), and the dashboard's ~10
        # processes would cost ~0.3 GB of a small machine (jobs go to `fp8rl serve`'s head).
        head = start_local_ray(
            temp_dir / "head.log", temp_dir=temp_dir, num_cpus=num_cpus, dashboard=False
        )
    except BaseException:  # a Ctrl-C inside `ray start`'s wait: its head would outlive us
        stop_head_in(temp_dir)
        if watchdog_pid is not None:
            _end_watchdog(watchdog_pid)
        raise
    log.info(
        "private Ray head %s (pid %d), watchdog pid %d", head.gcs_address, head.pid, watchdog_pid
    )
    return PrivateRay(head, watchdog_pid)


def _start_watchdog(temp_dir: Path) -> int:
    """Start ``main`` watching this process and the head of ``temp_dir``; its pid."""
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "fp8rl.services.private_ray", str(os.getpid()), str(temp_dir)],
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # a SIGKILL of the driver's group must not take the watchdog
    )
    return watchdog.pid


def _end_watchdog(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def stop_head_in(temp_dir: Path) -> None:
    """Stop the private head of ``temp_dir`` whether it is up, still starting or not started
    yet (then it is called off: ``ray_head.claim_head``), and remove the dir."""
    leader = claim_head(temp_dir, CALLED_OFF)
    if leader != CALLED_OFF:
        stop_head(LocalRay("", "", leader, str(temp_dir)))
    shutil.rmtree(temp_dir, ignore_errors=True)


def stop_head(head: LocalRay, *, grace_s: float = 10.0) -> None:
    """SIGTERM to every process of the head's session (``head.pid`` is its id) in ``STOP_ORDER``,
    SIGKILL to those left after ``grace_s``, then remove the head's temp dir.

    The session, not the pid: the ``ray start`` that led it has exited (a private head runs
    without ``--block``), and its pid may since belong to another process.
    """
    deadline = time.monotonic() + grace_s
    for stage in STOP_ORDER:

        def left(stage: Callable[[str], bool] = stage) -> list[int]:
            return [pid for pid in session_members(head.pid) if stage(_name(pid))]

        _signal_all(left(), signal.SIGTERM)
        while left() and time.monotonic() < deadline:
            time.sleep(0.05)
    _signal_all(session_members(head.pid), signal.SIGKILL)
    if head.temp_dir:
        shutil.rmtree(head.temp_dir, ignore_errors=True)


def _name(pid: int) -> str:
    """The process's name (``/proc/PID/comm``: the executable's first 15 characters)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


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
    """``python -m fp8rl.services.private_ray DRIVER_PID TEMP_DIR``: the watchdog."""
    driver, temp_dir = int(argv[0]), Path(argv[1])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the driver stopped the head itself
    while _alive(driver):
        if _head_gone(temp_dir):  # ended by itself: its session id may be reused, leave it be
            return 0
        time.sleep(POLL_S)
    stop_head_in(temp_dir)
    return 0


def _head_gone(temp_dir: Path) -> bool:
    """Whether the head of ``temp_dir`` started and has ended, or was stopped with its dir."""
    try:
        leader = int((temp_dir / LEADER_FILE).read_text())
    except FileNotFoundError:  # not started yet, or stopped with its dir
        return not temp_dir.exists()
    return leader != CALLED_OFF and not session_members(leader)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
