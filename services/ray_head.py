"""``python -m fp8rl.services.ray_head [RAY START OPTIONS]``: ``ray start --head`` for a private
head, lighter than the plain command (issue 18, the quickstart's memory).

- No Ray client server. ``ray start --head`` always starts one when Ray's client dependencies
  are installed (port 10001 unless given; port 0 is refused), a 0.05 GB process that nobody
  uses: ``fp8rl run`` connects through the GCS. It is skipped by telling ``ray start`` that the
  client is unavailable (``get_ray_client_dependency_error``), which is exactly what a minimal
  Ray install does.
- With ``--include-dashboard=false``, no API server either: Ray still starts its dashboard
  process to serve usage statistics alone (0.07 GB), which ``--disable-usage-stats`` has
  turned off anyway. ``ray start`` runs on without it, as when the dashboard fails to start and
  was not asked for (``start_api_server`` returns no process).
- Without ``--block`` (the caller's choice) ``ray start`` returns once every process of the
  node is up, so no 0.14 GB Python process waits beside them; the head's processes stay in the
  session ``ray start`` led, and ``private_ray.stop_head`` stops them by that session id.
- Before starting anything it records its pid (the session id) in ``<temp dir>/head.leader``
  (``claim_head``), so the driver's watchdog can stop a head that is still starting; when the
  file is already there (the driver was interrupted and its watchdog called the head off) or the
  temp dir is gone, it starts nothing and exits 1.

Everything else is ``ray start`` itself (``ray.scripts.scripts``), with its options and exit code.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

NO_CLIENT = "fp8rl private head: no Ray client server"

LEADER_FILE = "head.leader"
"""In a private head's temp dir: the pid of its ``ray start`` (the id of the session its
processes live in), or ``0`` when the head was called off before it started."""

CALLED_OFF = 0
"""``claim_head``'s pid for a head that must not start."""


def main(argv: list[str]) -> int:
    """Run ``ray start ARGV`` without the Ray client server; returns its exit code (1 without
    starting anything when the head was called off: see ``claim_head``)."""
    temp_dir = _option(argv, "--temp-dir")
    if temp_dir is not None and claim_head(temp_dir, os.getpid()) != os.getpid():
        print("fp8rl private head: called off before it started (its driver stopped)")
        return 1
    import ray._private.services as services
    import ray.scripts.scripts as ray_cli

    ray_cli.get_ray_client_dependency_error = lambda: NO_CLIENT
    if "--include-dashboard=false" in argv:
        services.start_api_server = _no_api_server
    try:
        ray_cli.cli.main(args=["start", *argv], prog_name="ray")
    except SystemExit as exc:  # click ends every command with one
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def claim_head(temp_dir: str | Path, pid: int) -> int:
    """Record ``pid`` as the head's session leader in ``<temp_dir>/LEADER_FILE`` unless a pid is
    recorded there already; return the pid that stands (``CALLED_OFF`` when the dir is gone).

    The head's ``ray start`` claims with its own pid before it starts any process; whoever stops
    a head claims with ``CALLED_OFF``: exactly one of them wins (a hard link is created
    atomically or not at all), so a head is either called off or known by its session id.
    """
    leader = Path(temp_dir) / LEADER_FILE
    try:
        fd, draft = tempfile.mkstemp(dir=temp_dir, prefix=f"{LEADER_FILE}.")
    except FileNotFoundError:  # the temp dir was removed: the head was stopped
        return CALLED_OFF
    try:
        with os.fdopen(fd, "w") as out:
            out.write(str(pid))
        os.link(draft, leader)  # complete content, or FileExistsError
        return pid
    except FileExistsError:
        return _recorded(leader)
    except FileNotFoundError:  # removed meanwhile by whoever stopped the head
        return CALLED_OFF
    finally:
        Path(draft).unlink(missing_ok=True)


def _recorded(leader: Path) -> int:
    try:
        return int(leader.read_text())
    except FileNotFoundError:  # removed meanwhile by whoever stopped the head
        return CALLED_OFF


def _option(argv: list[str], name: str) -> str | None:
    """The value of ``NAME=VALUE`` in ``argv`` (``ray start``'s form for it here)."""
    return next((a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")), None)


def _no_api_server(*args: object, **kwargs: object) -> tuple[None, None]:
    """``services.start_api_server`` when the dashboard is off: start nothing (Ray's own
    result when its dashboard cannot start and is not required)."""
    return None, None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
