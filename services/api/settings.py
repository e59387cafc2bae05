"""Settings of the REST service and how ``fp8rl serve`` fills them (flags, then environment).

Names shared with the Helm chart: ``FP8RL_API_TOKEN`` (the bearer token), ``RAY_ADDRESS`` (Ray's
dashboard URL, ``http://head:8265``), ``FP8RL_DATA_DIR`` (run directories, default store), port
8000, ``GET /healthz``. Without a token the service creates one in ``DATA_DIR/api-token`` (mode
0600) and says where it is: the API never runs without authentication.
"""

from __future__ import annotations

import os
import secrets
import shlex
import sys
from pathlib import Path

from pydantic import Field, SecretStr

from fp8rl.protocol.base import StrictModel
from fp8rl.services.api.policy import SpecPolicy

TOKEN_ENV = "FP8RL_API_TOKEN"
TOKEN_FILE_NAME = "api-token"
MIN_TOKEN_CHARS = 16


class ApiSettings(StrictModel):
    """Everything the service needs; built once at start (see ``serve``)."""

    data_dir: Path
    """Server-owned directory: ``runs/<run id>/`` (spec.yaml, the run's output) and the default store."""

    db_url: str
    """SQLAlchemy URL of the run store (``sqlite:////abs/path/runs.db``, ``postgresql+psycopg://…``)."""

    token: SecretStr
    """Bearer token every request (but /healthz, /version, the OpenAPI docs) must carry."""

    ray_address: str | None = None
    """Ray dashboard URL for job submission; None: a local Ray started (or reused) by the service."""

    driver_entrypoint: str | None = None
    """Command that runs the driver; the spec path is appended. None: ``<python> -m fp8rl.services.driver``
    with this interpreter for a local Ray and ``python`` for a remote cluster."""

    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    """Largest accepted request body (413 above it)."""

    stop_timeout_s: float = Field(default=120.0, gt=0)
    """After a stop request, how long the driver has to checkpoint and exit before Ray stops the job."""

    monitor_interval_s: float = Field(default=1.0, gt=0)
    """Seconds between reconciliations of active runs with Ray's job states."""

    sse_poll_s: float = Field(default=0.5, gt=0)
    """Seconds between store polls of an open event stream."""

    lost_job_grace_s: float = Field(default=30.0, ge=0)
    """A run whose Ray job Ray does not know is marked FAILED once it is older than this."""

    max_active_runs: int = Field(default=8, ge=1)
    """Runs PENDING or RUNNING at once; a POST above it gets 429 with ``Retry-After``."""

    policy: SpecPolicy = Field(default_factory=SpecPolicy)
    """What API specs may name (paths, reward modules, remote reward URLs); see ``policy.py``."""


def load_token(*, token_file: Path | None, data_dir: Path) -> tuple[str, str]:
    """The bearer token and where it came from.

    Order: ``token_file``, then ``$FP8RL_API_TOKEN``, then ``data_dir/api-token`` (created with a
    random token, mode 0600, when missing).

    Raises:
        ValueError: the token file cannot be read, or a token is shorter than 16 characters.
    """
    if token_file is not None:
        try:
            token = Path(token_file).expanduser().read_text().strip()
        except OSError as exc:
            raise ValueError(f"--token-file {token_file}: {exc.strerror or exc}") from None
        source = str(token_file)
    elif os.environ.get(TOKEN_ENV, "").strip():
        token, source = os.environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
    else:
        path = data_dir / TOKEN_FILE_NAME
        if not path.exists():
            data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(32) + "\n")
        token, source = path.read_text().strip(), str(path)
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"API token from {source} is {len(token)} characters; use at least {MIN_TOKEN_CHARS} "
            "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
        )
    return token, source


def default_entrypoint(ray_address: str | None) -> str:
    """The driver command for a Ray address (None = local Ray started by the service).

    A local Ray runs jobs on this machine, so this interpreter is the right one (a bare
    ``python`` may be another installation); a remote cluster has its own ``python``.
    """
    local = ray_address is None or any(
        host in ray_address for host in ("127.0.0.1", "localhost", "[::1]")
    )
    python = shlex.quote(sys.executable) if local else "python"
    return f"{python} -m fp8rl.services.driver"
