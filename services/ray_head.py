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

Everything else is ``ray start`` itself (``ray.scripts.scripts``), with its options and exit code.
"""

from __future__ import annotations

import sys

NO_CLIENT = "fp8rl private head: no Ray client server"


def main(argv: list[str]) -> int:
    """Run ``ray start ARGV`` without the Ray client server; returns its exit code."""
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


def _no_api_server(*args: object, **kwargs: object) -> tuple[None, None]:
    """``services.start_api_server`` when the dashboard is off: start nothing (Ray's own
    result when its dashboard cannot start and is not required)."""
    return None, None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
