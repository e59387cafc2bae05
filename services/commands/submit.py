"""``fp8rl submit SPEC [k=v …]``: validate locally, then ``ray job submit`` the driver to a cluster.

The Python twin of ``deploy/submit.sh``: the spec is checked here (a typo fails in a second, not
on the cluster), the working directory (default: the current one, which must hold the spec) is
uploaded with ``deploy/runtime_env.yaml``'s excludes and variables when present, and the logs are
followed until the job ends (``--no-wait`` returns after submitting).
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Annotated

import typer
import yaml

from fp8rl.protocol import SpecError
from fp8rl.services.commands.common import fail, read_spec
from fp8rl.services.preflight import preflight

TERMINAL = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 1}


def submit(
    spec: Annotated[Path, typer.Argument(help="YAML job spec (inside --working-dir).")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Dotted overrides, e.g. steps=100.")
    ] = None,
    address: Annotated[
        str, typer.Option(help="Ray dashboard / job API of the cluster.", envvar="RAY_ADDRESS")
    ] = ("http://127.0.0.1:8265"),
    working_dir: Annotated[
        Path, typer.Option(help="Directory uploaded as the job's working directory.")
    ] = Path("."),
    runtime_env: Annotated[
        Path | None,
        typer.Option(
            help="Runtime env YAML (default: deploy/runtime_env.yaml "
            "in the working directory, when present)."
        ),
    ] = None,
    wait: Annotated[bool, typer.Option(help="Follow the job's logs until it ends.")] = True,
) -> None:
    """Submit a job spec to a Ray cluster.

    The job runs the same driver as `fp8rl run` and the REST API.
    """
    job = read_spec(spec, overrides)  # exit 2 with the field path on a bad spec
    try:
        preflight(job, local=False)  # cluster paths and extras are the cluster's to check
    except SpecError as exc:
        raise fail(str(exc)) from None
    root = working_dir.resolve()
    try:
        relative = spec.resolve().relative_to(root)
    except ValueError:
        raise fail(
            f"{spec}: the spec must be inside --working-dir {root} (it is uploaded with it)"
        ) from None
    env_file = runtime_env or root / "deploy" / "runtime_env.yaml"
    env = yaml.safe_load(env_file.read_text()) if env_file.exists() else {}
    env["working_dir"] = str(root)
    entrypoint = shlex.join(
        ["python", "-m", "fp8rl.services.driver", str(relative), *(overrides or [])]
    )
    client = _client(address)
    job_id = client.submit_job(entrypoint=entrypoint, runtime_env=env)
    typer.echo(f"submitted {job_id} to {address}: {entrypoint}")
    if not wait:
        return
    seen = 0
    while True:  # poll the logs (a plain loop: works the same in notebooks and scripts)
        logs = client.get_job_logs(job_id)
        typer.echo(logs[seen:], nl=False)
        seen = len(logs)
        status = str(client.get_job_status(job_id)).rsplit(".", 1)[-1]
        if status in TERMINAL:
            typer.echo(f"job {job_id}: {status}")
            raise typer.Exit(TERMINAL[status])
        time.sleep(2)


def _client(address: str):
    from ray.job_submission import JobSubmissionClient

    from fp8rl.services.api.ray_launcher import ray_auth_token

    token = ray_auth_token()
    try:
        return JobSubmissionClient(
            address, headers={"Authorization": f"Bearer {token}"} if token else None
        )
    except (ConnectionError, RuntimeError, OSError) as exc:
        raise fail(f"--address {address}: no Ray job API there ({exc})") from None


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""
    app.command()(submit)
