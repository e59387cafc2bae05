"""Runs as Ray jobs, through Ray's Job Submission client (the dashboard's HTTP API).

The service submits ``<python> -m fp8rl.services.driver SPEC_PATH`` with ``submission_id`` =
the run's job id, so the API, ``ray job submit`` and ``fp8rl run`` execute the same driver. Ray's
job record is the ground truth of whether the process lives; the run store holds what the driver
reported. ``RunMonitor`` reconciles the two.

Without ``--ray-address`` the service starts a local Ray head (``ray start --head --block`` in its
own session, ports chosen free, dashboard on 127.0.0.1, its own ``--temp-dir``) and records it in
``DATA_DIR/local-ray.json``. The private temp dir matters on shared machines: ``ray start`` writes
its address to ``<temp dir>/ray_current_cluster``, and with the default ``/tmp/ray`` every plain
``ray.init()`` on the machine would attach to this head (and, once it is gone, try to reach a dead
address until ``ray stop`` clears the file). The head outlives the service on purpose, so a restarted service
finds its running jobs again; the next start reuses it when it still answers. Stop it with
``kill <pid>`` (the pid in the record) or ``ray stop``.

Ray token authentication (on by default for new local clusters since Ray 2.5x: ``ray start``
enables it when a token exists): the launcher sends the token Ray itself would use, looked up in
Ray's order (``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``), unless
``RAY_AUTH_MODE=disabled``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8rl.protocol import RunState
from fp8rl.services.api.launcher import JobLauncher, JobStatus, LauncherUnavailable
from fp8rl.workers.ports import free_ports

log = logging.getLogger(__name__)
LOCAL_RAY_RECORD = "local-ray.json"
_API_SERVER_ENV = "RAY_API_SERVER_ADDRESS"
_ENV_LOCK = threading.Lock()


class RayJobLauncher(JobLauncher):
    """``JobLauncher`` over ``ray.job_submission.JobSubmissionClient``.

    Args:
        address: Ray dashboard URL (``http://127.0.0.1:8265``) or any address the client accepts.

    The client is created on first use and again after a connection failure, so the service
    starts (and answers /healthz) while Ray is still coming up.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self._client: Any = None

    def _connect(self) -> Any:
        from ray.job_submission import JobSubmissionClient

        token = ray_auth_token()
        headers = {"Authorization": f"Bearer {token}"} if token else None
        # Ray lets $RAY_API_SERVER_ADDRESS / $RAY_ADDRESS override the address given to the
        # client; the service's --ray-address (or its local head) must win, so pin it while the
        # client resolves it (the client keeps the resolved URL afterwards).
        with _ENV_LOCK:
            saved = os.environ.get(_API_SERVER_ENV)
            os.environ[_API_SERVER_ENV] = self.address
            try:
                return JobSubmissionClient(self.address, headers=headers)
            finally:
                if saved is None:
                    os.environ.pop(_API_SERVER_ENV, None)
                else:
                    os.environ[_API_SERVER_ENV] = saved

    def _call(self, what: str, fn_name: str, *args: Any, **kwargs: Any) -> Any:
        try:
            if self._client is None:
                self._client = self._connect()
            return getattr(self._client, fn_name)(*args, **kwargs)
        except RuntimeError as exc:
            if "status code 404" in str(exc):
                raise _NotFound from None
            raise LauncherUnavailable(f"Ray at {self.address}: {what} failed: {exc}") from None
        except (OSError, ConnectionError) as exc:  # requests' errors are OSErrors
            self._client = None
            raise LauncherUnavailable(
                f"Ray at {self.address} is unreachable ({what}): {exc}"
            ) from None

    def submit(self, *, job_id: str, entrypoint: str, env_vars: dict[str, str]) -> None:
        """Submit the driver as Ray job ``job_id``."""
        try:
            self._call(
                "submit",
                "submit_job",
                entrypoint=entrypoint,
                submission_id=job_id,
                runtime_env={"env_vars": env_vars},
            )
        except _NotFound:
            raise LauncherUnavailable(f"Ray at {self.address} has no job API") from None

    def status(self, job_id: str) -> JobStatus | None:
        """Ray's JobStatus mapped onto RunState (same names), with Ray's message."""
        try:
            info = self._call("status", "get_job_info", job_id)
        except _NotFound:
            return None
        state = RunState(str(getattr(info.status, "value", info.status)))
        return JobStatus(state=state, message=info.message or "")

    def stop(self, job_id: str) -> None:
        """Ask Ray to stop the job (SIGTERM, SIGKILL after Ray's grace period)."""
        with contextlib.suppress(_NotFound):
            self._call("stop", "stop_job", job_id)

    def logs_tail(self, job_id: str, *, lines: int) -> list[str]:
        """Tail of the job's stdout/stderr as Ray captured it."""
        try:
            text = self._call("logs", "get_job_logs", job_id)
        except _NotFound:
            return []
        return text.splitlines()[-lines:] if lines > 0 else []

    def delete(self, job_id: str) -> None:
        """Delete Ray's record of a finished job (best effort)."""
        try:
            self._call("delete", "delete_job", job_id)
        except (_NotFound, LauncherUnavailable) as exc:
            log.info("could not delete Ray job %s: %s", job_id, exc)


class _NotFound(Exception):
    pass


@dataclass(frozen=True)
class LocalRay:
    """A Ray head on this machine: its dashboard URL, the pid of ``ray start --block`` (for a
    private head started without ``--block``: the id of the session its processes are in) and
    its private temp dir (sessions, logs, sockets)."""

    dashboard_url: str
    gcs_address: str
    pid: int
    temp_dir: str = ""

    def stop(self, *, timeout_s: float = 60.0, remove_files: bool = False) -> None:
        """Shut the head down: SIGTERM to ``ray start --block`` (it drains and stops its
        processes), then SIGKILL to whatever is left of the process group it leads;
        ``remove_files`` deletes its temp dir (logs included) afterwards."""
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            self._remove(remove_files)
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _alive(self.pid):
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self._remove(remove_files)

    def _remove(self, remove_files: bool) -> None:
        if remove_files and self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def ray_auth_token() -> str | None:
    """The Ray auth token this process would use (Ray's lookup order), None when disabled/absent."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def make_token_private() -> Path | None:
    """chmod 0600 Ray's auth-token file when it exists and is ours; returns its path."""
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        if path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o077:
            path.chmod(0o600)
    except OSError:
        return None
    return path


def dashboard_alive(url: str, *, timeout_s: float = 2.0) -> bool:
    """Whether a Ray dashboard answers at ``url`` (a 401 of token authentication counts)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/api/version", timeout=timeout_s) as resp:
            return resp.status == 200
    except urllib.error.HTTPError as exc:
        return exc.code == 401
    except OSError:
        return False


def start_local_ray(
    log_path: Path,
    *,
    temp_dir: Path | None = None,
    num_cpus: int | None = None,
    dashboard: bool = True,
    timeout_s: float = 120.0,
) -> LocalRay:
    """Start a Ray head on free loopback ports, in its own session.

    Every port Ray would otherwise take at a fixed default (GCS 6379, dashboard 8265, client
    server 10001, dashboard agent 52365) is chosen free, and ``temp_dir`` (default: a new
    ``/tmp/fp8rl-ray-*``; keep it short, Ray puts unix sockets there) keeps the head out of
    ``/tmp/ray``, so several heads share a machine without attaching each other's drivers.

    ``dashboard``: run Ray's dashboard (the job-submission API of ``fp8rl serve``) under
    ``ray start --block`` (the returned pid; stopping it stops the head); the head is ready when
    the dashboard answers. Without it: ``fp8rl run``'s private head, for one driver that talks to
    the GCS only (``services/ray_head.py``): no dashboard (~10 processes, ~0.3 GB), no autoscaler
    monitor (nothing to scale), no Ray client server (0.05 GB), and no ``--block`` (0.14 GB):
    ``ray start`` returns once every process of the node is up and has written
    ``<temp_dir>/ray_current_cluster``. The returned pid is then that of the exited ``ray
    start``: the id of the session its processes stay in (``private_ray.stop_head`` stops them
    by it); ``dashboard_url`` is empty.

    Raises:
        RuntimeError: the head did not come up within ``timeout_s`` (the log tail says why).
    """
    gcs, dashboard_port, client, agent = free_ports(4)
    if temp_dir is None:
        temp_dir = Path(tempfile.mkdtemp(prefix="fp8rl-ray-"))
    temp_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        *(
            ("ray.scripts.scripts", "start", "--block")
            if dashboard
            else ("fp8rl.services.ray_head",)
        ),
        "--head",
        f"--port={gcs}",
        "--node-ip-address=127.0.0.1",
        f"--include-dashboard={str(dashboard).lower()}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}",
        f"--dashboard-agent-listen-port={agent}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    if dashboard:
        command.append(f"--ray-client-server-port={client}")
    else:
        command.append("--no-monitor")  # the autoscaler's monitor: nothing to scale on one node
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{dashboard_port}" if dashboard else ""
    deadline = time.monotonic() + timeout_s
    while not (dashboard_alive(url) if dashboard else _head_up(proc, temp_dir)):
        exited = proc.poll() is not None and (dashboard or proc.returncode != 0)
        if exited or time.monotonic() > deadline:
            if dashboard:
                LocalRay(url, "", proc.pid, str(temp_dir)).stop(timeout_s=10)
            else:  # whatever the failed `ray start` left in its session
                from fp8rl.services.private_ray import stop_head

                stop_head(LocalRay(url, "", proc.pid, str(temp_dir)), grace_s=10)
            tail = log_path.read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(
                f"local Ray head did not start (log {log_path}):\n" + "\n".join(tail)
            )
        time.sleep(0.3)
    make_token_private()  # Ray may have just written it, readable by everyone
    return LocalRay(url, f"127.0.0.1:{gcs}", proc.pid, str(temp_dir))


def _head_up(proc: subprocess.Popen, temp_dir: Path) -> bool:
    """Whether ``ray start`` (without ``--block``) has returned 0 after writing its address file
    (it writes it once the node's processes have started)."""
    from ray._private.utils import read_ray_address

    return proc.poll() == 0 and bool(read_ray_address(str(temp_dir)))


def ensure_local_ray(data_dir: Path) -> LocalRay:
    """Reuse the local Ray head recorded in ``data_dir`` if it answers, else start one."""
    record = data_dir / LOCAL_RAY_RECORD
    if record.exists():
        try:
            known = LocalRay(**json.loads(record.read_text()))
        except (ValueError, TypeError):
            known = None
        if known is not None and dashboard_alive(known.dashboard_url):
            log.info("reusing local Ray at %s (pid %d)", known.dashboard_url, known.pid)
            return known
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:10]
    head = start_local_ray(
        data_dir / "local-ray.log", temp_dir=Path(tempfile.gettempdir()) / f"fp8rl-ray-{digest}"
    )
    record.write_text(json.dumps(head.__dict__))
    log.info(
        "started local Ray at %s (pid %d); it keeps running after the service stops "
        "(stop it with `kill %d`)",
        head.dashboard_url,
        head.pid,
        head.pid,
    )
    return head


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # reap if it is our child
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
