"""``fp8rl runs submit|list|show|logs|stop|watch``: a client of the REST API (``fp8rl serve``).

Every command takes ``--api URL`` ($FP8RL_API_URL, default http://127.0.0.1:8000) and the token
from ``--token`` ($FP8RL_API_TOKEN), ``--token-file``, or the local server's
``$FP8RL_DATA_DIR/api-token`` (default ``~/.fp8rl/api-token``). Server errors print the server's
problem details and exit with code 1 (2 for usage errors).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from fp8rl.services.commands.common import fail

runs_app = typer.Typer(
    name="runs",
    help="Submit, list, inspect, follow and stop runs of `fp8rl serve`.",
    no_args_is_help=True,
)

ApiUrl = Annotated[str, typer.Option("--api", help="API base URL.", envvar="FP8RL_API_URL")]
Token = Annotated[
    str | None, typer.Option(help="Bearer token.", envvar="FP8RL_API_TOKEN", show_envvar=True)
]
TokenFile = Annotated[Path | None, typer.Option(help="File holding the bearer token.")]
RunIdArg = Annotated[str, typer.Argument(help="Run id (see `fp8rl runs list`).")]
DEFAULT_API = "http://127.0.0.1:8000"
TERMINAL = ("STOPPED", "SUCCEEDED", "FAILED")


def _client(api: str, token: str | None, token_file: Path | None):
    from fp8rl.services.api.client import ApiClient

    if not token and token_file is not None:
        try:
            token = token_file.expanduser().read_text().strip()
        except OSError as exc:
            raise fail(f"--token-file {token_file}: {exc.strerror or exc}") from None
    if not token:
        local = Path(os.environ.get("FP8RL_DATA_DIR", "~/.fp8rl")).expanduser() / "api-token"
        if local.exists():
            token = local.read_text().strip()
    if not token:
        raise fail("no API token: pass --token, set FP8RL_API_TOKEN or use --token-file")
    return ApiClient(api, token)


def _call(fn, *args: Any, **kwargs: Any) -> Any:
    from fp8rl.services.api.client import ApiError

    try:
        return fn(*args, **kwargs)
    except ApiError as exc:
        errors = exc.problem.get("errors") or []
        if not errors:
            raise fail(str(exc), code=1) from None
        # the problem's detail joins the same errors: print the title, then one line each
        lines = [f"{exc.status}: {exc.problem.get('title') or 'invalid request'}"]
        lines += [f"  {e['path']}: {e['message']}" for e in errors]
        raise fail("\n".join(lines), code=1) from None


def _console():
    from rich.console import Console

    return Console()


@runs_app.command("list")
def list_runs(
    state: Annotated[
        str | None, typer.Option(help="Only runs in this state (RUNNING, FAILED, …).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    api: ApiUrl = DEFAULT_API,
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """Runs, newest first."""
    from rich.table import Table

    with _client(api, token, token_file) as client:
        page = _call(
            client.list_runs, state=state.upper() if state else None, limit=limit, offset=offset
        )
    table = Table("id", "state", "step", "created", "error")
    for run in page["runs"]:
        step = f"{run['current_step'] if run['current_step'] is not None else '-'}/{run['total_steps']}"
        error = (run["error"] or "").splitlines()[0][:60] if run["error"] else ""
        table.add_row(run["id"], _styled(run["state"]), step, run["created_at"][:19], error)
    console = _console()
    console.print(table)
    if page["next_offset"] is not None:
        console.print(f"{page['total']} runs; next page: --offset {page['next_offset']}")


@runs_app.command("show")
def show(
    run_id: RunIdArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
    api: ApiUrl = DEFAULT_API,
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """State, step, quant fingerprint, latest metrics and error of one run."""
    with _client(api, token, token_file) as client:
        run = _call(client.get_run, run_id)
    if as_json:
        typer.echo(json.dumps(run, indent=2))
        return
    console = _console()
    console.print(f"[bold]{run['id']}[/]  {_styled(run['state'])}")
    step = run["current_step"] if run["current_step"] is not None else "-"
    console.print(
        f"step {step}/{run['total_steps']}  quant fingerprint {run['quant_fingerprint'] or '-'}"
    )
    console.print(f"run dir {run['run_dir']}  (Ray job {run['ray_job_id']})")
    if run["stop_requested"] and run["state"] not in TERMINAL:
        console.print("[yellow]stop requested[/]")
    latest = run.get("latest_metrics")
    if latest:
        console.print(_metrics_table(latest["step"], latest["values"]))
    if run["error"]:
        console.print(f"[red]error:[/] {run['error']}", markup=True, highlight=False)


@runs_app.command("logs")
def logs(
    run_id: RunIdArg,
    tail: Annotated[int, typer.Option(min=1, max=10_000, help="Lines to show.")] = 200,
    source: Annotated[
        str, typer.Option(help="driver: lines the driver reported; ray: the job's stdout/stderr.")
    ] = "driver",
    api: ApiUrl = DEFAULT_API,
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """The last lines of a run's log."""
    with _client(api, token, token_file) as client:
        lines = _call(client.logs, run_id, tail=tail, source=source)
    for line in lines:
        typer.echo(line)


@runs_app.command("stop")
def stop(
    run_id: RunIdArg, api: ApiUrl = DEFAULT_API, token: Token = None, token_file: TokenFile = None
) -> None:
    """Ask a run to stop (its driver checkpoints, then it ends STOPPED)."""
    with _client(api, token, token_file) as client:
        run = _call(client.stop_run, run_id)
    note = (
        "stop requested; the driver checkpoints and exits" if run["state"] not in TERMINAL else ""
    )
    _console().print(f"{run['id']}: {_styled(run['state'])} {note}")


@runs_app.command("submit")
def submit(
    spec: Annotated[Path, typer.Argument(help="YAML job spec (sent as its text).")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Dotted overrides, e.g. steps=2 rollout.n=4.")
    ] = None,
    detach: Annotated[
        bool, typer.Option("--detach", help="Print the run id and return; do not follow.")
    ] = False,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Retry-safe key: resubmitting it returns the same run.")
    ] = None,
    api: ApiUrl = DEFAULT_API,
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """Submit a job spec (POST /runs), then follow it like `runs watch`.

    The server validates the spec (errors name the field, exit 1) and chooses the run directory.
    Exit code 0 only when the run SUCCEEDED (or at once with --detach).
    """
    try:
        text = spec.read_text()
    except OSError as exc:
        raise fail(f"{spec}: {exc.strerror or exc}") from None
    console = _console()
    with _client(api, token, token_file) as client:
        run = _call(
            client.create_run, text, overrides=overrides or [], idempotency_key=idempotency_key
        )
        console.print(f"submitted {run['id']} ({_styled(run['state'])}); run dir {run['run_dir']}")
        if detach:
            console.print(f"follow it with: fp8rl runs watch {run['id']}", highlight=False)
            return
        _watch(client, run["id"], console)


@runs_app.command("watch")
def watch(
    run_id: RunIdArg, api: ApiUrl = DEFAULT_API, token: Token = None, token_file: TokenFile = None
) -> None:
    """Follow a run live until it ends; exit code 0 only for SUCCEEDED.

    Progress and the latest metrics come from the server-sent events of GET /runs/{id}/events.
    """
    with _client(api, token, token_file) as client:
        _watch(client, run_id, _console())


def _watch(client, run_id: str, console) -> None:
    """Live progress and latest metrics until the run ends; ``typer.Exit(1)`` unless SUCCEEDED."""
    from rich.console import Group
    from rich.live import Live
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    run = _call(client.get_run, run_id)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task(f"{run_id} {run['state']}", total=run["total_steps"])
    state, error = run["state"], run["error"]
    with Live(Group(progress), console=console, refresh_per_second=4) as live:
        state, error = _call(_follow, client, run_id, live, progress, task, (state, error))
    console.print(f"{run_id}: {_styled(state)}")
    if error:
        console.print(f"[red]error:[/] {error}", highlight=False)
    if state != "SUCCEEDED":
        raise typer.Exit(1)


def _follow(client, run_id: str, live, progress, task, last: tuple[str, str | None]):
    """Render events until the terminal state; returns (state, error)."""
    from rich.console import Group

    state, error = last
    table = None
    for event in client.events(run_id):
        if event.event == "step":
            progress.update(task, completed=event.data["step"])
            table = _metrics_table(event.data["step"], event.data["metrics"])
        elif event.event == "state":
            state, error = event.data.get("state") or "DELETED", event.data.get("error")
            progress.update(task, description=f"{run_id} {state}")
        live.update(Group(progress, table) if table is not None else Group(progress))
    return state, error


def _metrics_table(step: int, values: dict[str, Any]):
    from rich.table import Table

    table = Table("metric", "value", title=f"step {step}", title_justify="left")
    for name in sorted(values)[:20]:
        value = values[name]
        table.add_row(name, "nan/inf" if value is None else f"{value:.6g}")
    return table


def _styled(state: str | None) -> str:
    color = {"SUCCEEDED": "green", "FAILED": "red", "STOPPED": "yellow", "RUNNING": "cyan"}.get(
        state or "", "white"
    )
    return f"[{color}]{state}[/]"


def register(app: typer.Typer) -> None:
    """Add the ``runs`` command group to the CLI."""
    app.add_typer(runs_app)
