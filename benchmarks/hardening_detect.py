"""Time to detect each hostile input of issue 17, measured on this machine (CPU only).

    python benchmarks/hardening_detect.py [--ray] [--out benchmarks/results/hardening-detect-cpu.md]

Each row runs the real code path (the API in-process over an in-memory launcher, the reward
worker, the health guard, the dataset reader, the watchdog) and prints the new behaviour and the
wall time from the hostile input to its refusal. ``--ray`` adds row 12 with a real private Ray
head (about 20-60 s to start on 2 cores). Rows 3-4 (checkpoint integrity) are not measured here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml
from fastapi.testclient import TestClient

from fp8rl.protocol import RunState
from fp8rl.protocol.health_spec import HealthSpec
from fp8rl.protocol.reward_messages import RewardInput
from fp8rl.protocol.reward_spec import RewardSpec
from fp8rl.services.api import ApiSettings, create_app
from fp8rl.services.api.launcher import JobLauncher, JobStatus
from fp8rl.services.data import build_dataset
from fp8rl.services.health import HealthGuard, RunUnhealthy
from fp8rl.services.private_ray import session_members
from fp8rl.workers.reward import RewardWorker
from fp8rl.workers.reward.worker import RewardFailure

REPO = Path(__file__).resolve().parents[1]
TOKEN = "bench-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RUNS = "/api/v1/runs"


class MemoryLauncher(JobLauncher):
    """Records submissions; every job is RUNNING."""

    address = "memory://"

    def __init__(self) -> None:
        self.jobs: dict[str, JobStatus] = {}

    def submit(self, *, job_id: str, entrypoint: str, env_vars: dict[str, str]) -> None:
        self.jobs[job_id] = JobStatus(RunState.RUNNING)

    def status(self, job_id: str) -> JobStatus | None:
        return self.jobs.get(job_id)

    def stop(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)

    def logs_tail(self, job_id: str, *, lines: int) -> list[str]:
        return []

    def delete(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    """``fn()`` and its wall time in seconds."""
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def api_rows(root: Path) -> list[tuple[str, str, str]]:
    """Rows 1, 2, 9, 10, 11 through the HTTP API."""
    settings = ApiSettings(
        data_dir=root / "data",
        db_url=f"sqlite:///{root / 'data' / 'runs.db'}",
        token=TOKEN,
        max_active_runs=2,
        lost_job_grace_s=60.0,
    )
    launcher = MemoryLauncher()
    quickstart = yaml.safe_load((REPO / "deploy" / "jobs" / "quickstart.yaml").read_text())
    bomb = (
        "a0: &a0 ["
        + ",".join(['"lol"'] * 10)
        + "]\n"
        + "".join(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 10))
    )
    rows = []
    with TestClient(create_app(settings, launcher=launcher)) as client:
        yaml_headers = {**AUTH, "Content-Type": "application/yaml"}
        r, t = timed(lambda: client.post(RUNS, content=bomb, headers=yaml_headers))
        rows.append((f"1 YAML alias bomb ({len(bomb)} B)", f"{r.status_code}: MAX_NODES", fmt(t)))
        deep = '{"a": ' * 5000 + "1" + "}" * 5000
        r, t = timed(lambda: client.post(RUNS, content=deep, headers=AUTH))
        rows.append(("2 JSON nested 5000 deep", f"{r.status_code}: MAX_DEPTH", fmt(t)))
        deep_yaml = "a: " + "[" * 5000 + "]" * 5000
        r, t = timed(lambda: client.post(RUNS, content=deep_yaml, headers=yaml_headers))
        rows.append(("2 YAML nested 5000 deep", f"{r.status_code}: MAX_DEPTH", fmt(t)))
        spec = dict(quickstart, model={**quickstart["model"], "path": "/etc"})
        r, t = timed(lambda: client.post(RUNS, json=spec, headers=AUTH))
        rows.append(("11 model.path=/etc over the API", f"{r.status_code}: outside roots", fmt(t)))
        spec = dict(quickstart, reward={"functions": [{"name": "os:system"}]})
        r, t = timed(lambda: client.post(RUNS, json=spec, headers=AUTH))
        rows.append(("11 reward os:system over the API", f"{r.status_code}: not allowed", fmt(t)))
        for _ in range(2):
            client.post(RUNS, json=quickstart, headers={**AUTH, "Idempotency-Key": f"k{_}"})
        r, t = timed(lambda: client.post(RUNS, json=quickstart, headers=AUTH))
        retry = r.headers.get("retry-after")
        rows.append(
            ("10 POST above max_active_runs", f"{r.status_code}, Retry-After {retry}", fmt(t))
        )
        first = client.get(RUNS, headers=AUTH).json()["runs"][-1]["id"]
    store_path = settings.data_dir / "runs.db"
    import sqlite3

    with sqlite3.connect(store_path) as db:  # the "crash": responses never stored
        db.execute("UPDATE idempotency_keys SET status_code = NULL, response = NULL")
    start = time.perf_counter()
    with TestClient(create_app(settings, launcher=launcher)) as client:
        restarted = time.perf_counter() - start
        r = client.post(RUNS, json=quickstart, headers={**AUTH, "Idempotency-Key": "k0"})
        total = client.get(RUNS, headers=AUTH).json()["total"]
    same = r.json().get("id") == first
    rows.append(
        (
            "9 retry after a server crash",
            f"{r.status_code}, same run: {same}, runs: {total}",
            f"keys released at start ({fmt(restarted)} start-up)",
        )
    )
    return rows


def item(response: str) -> RewardInput:
    return RewardInput(
        prompt_id="p", prompt="q", response=response, answer="1", finish_reason="stop",
        num_tokens=1, max_tokens=8,
    )  # fmt: skip


def reward_rows(root: Path) -> list[tuple[str, str, str]]:
    """Rows 5, 6, 7 (reward side)."""
    package = root / "bench_rewards"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fns.py").write_text(
        "import time\n\ndef hang(**_):\n    while True:\n        time.sleep(1)\n"
    )
    sys.path.insert(0, str(root))
    rows = []
    worker = RewardWorker(RewardSpec(functions=[{"name": "bench_rewards.fns.hang"}], timeout_s=2))
    try:
        worker._pool("bench_rewards.fns.hang")._children[0].call({}, 0.001)  # child started
        _, t = timed(lambda: _expect(RewardFailure, lambda: worker.score([item("x")])))
        rows.append(("5 custom reward never returns", "killed, run FAILED (timeout_s=2)", fmt(t)))
    finally:
        worker.close()
    worker = RewardWorker(
        RewardSpec(functions=[{"name": "format", "kwargs": {"pattern": "(.+)+#"}}])
    )
    _, t = timed(lambda: worker.score([item("a" * 100_000)]))
    rows.append(("6 pattern (.+)+# on 100 kB", "RE2: linear, scored 0", fmt(t)))
    guard = HealthGuard(HealthSpec(), vocab_size=49152)
    rewards = torch.tensor([1.0, math.nan, 0.0, 0.0])
    _, t = timed(lambda: _expect(RunUnhealthy, lambda: guard.check_rewards(0, rewards)))
    rows.append(("7 reward NaN", "FAILED before the update (same step)", fmt(t)))
    # quickstart with trainer.lr=1e3 on CPU (measured): entropy 2.05 -> 0.065 -> 0.0, reward 0,
    # grad_norm 0, all advantages 0; the guard sees the same metrics here
    guard = HealthGuard(HealthSpec(), vocab_size=49152)
    trajectory = [(2.05, 2.8, 0.125, torch.ones(2, 2)), (0.065, 0.0, 0.0, torch.zeros(2, 2))]
    trajectory += [(0.0, 0.0, 0.0, torch.zeros(2, 2))] * 8
    steps = 0
    try:
        for step, (entropy, grad_norm, reward, adv) in enumerate(trajectory):
            steps += 1
            metrics = {
                "actor/entropy": entropy,
                "actor/grad_norm": grad_norm,
                "reward/mean": reward,
            }
            guard.check_step(step, metrics, adv)
    except RunUnhealthy:
        pass
    rows.append(
        (
            "8 lr=1e3 collapse (entropy -> 0, reward 0)",
            f"FAILED naming actor/entropy, last healthy step {guard.last_healthy_step}",
            f"step {steps - 1} (collapse at step 1, patience_steps=3)",
        )
    )
    return rows


def _expect(kind: type[BaseException], fn: Callable[[], object]) -> None:
    try:
        fn()
    except kind:
        return
    raise AssertionError(f"expected {kind.__name__}")


def data_row(root: Path) -> tuple[str, str, str]:
    """Row 13: a non-UTF-8 byte in a JSONL dataset."""
    from fp8rl.protocol.data_spec import FileDataset

    path = root / "latin1.jsonl"
    path.write_bytes(b'{"question": "caf\xe9", "answer": "1"}\n')
    try:
        _, t = timed(lambda: build_dataset(FileDataset(path=str(path))))
        return ("13 non-UTF-8 byte in JSONL", "accepted?!", fmt(t))
    except ValueError as exc:
        start = time.perf_counter()
        _expect(ValueError, lambda: build_dataset(FileDataset(path=str(path))))
        named = "latin1.jsonl:1" in str(exc)
        return (
            "13 non-UTF-8 byte in JSONL",
            f"error names file:line: {named}",
            fmt(time.perf_counter() - start),
        )


DRIVER = """
import os, time
import ray
from fp8rl.services import runtime
runtime.init_ray(None)
@ray.remote(num_cpus=0)
def pid():
    return os.getpid()
print(os.getsid(ray.get(pid.remote())), flush=True)
time.sleep(300)
"""


def ray_row() -> tuple[str, str, str]:
    """Row 12: SIGKILL of a driver that started its own (private) Ray."""
    short = Path(tempfile.mkdtemp(prefix="f8"))
    env = {**os.environ, "TMPDIR": str(short), "RAY_TMPDIR": str(short)}
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True, env=env
    )
    session = int(driver.stdout.readline())
    before = len(session_members(session))
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    start = time.perf_counter()
    while session_members(session) and time.perf_counter() - start < 60:
        time.sleep(0.05)
    left = len(session_members(session))
    shutil.rmtree(short, ignore_errors=True)
    return (
        "12 SIGKILL of a driver with its own Ray",
        f"{before} Ray processes -> {left}",
        fmt(time.perf_counter() - start),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ray", action="store_true", help="also measure row 12 with a real Ray")
    parser.add_argument("--out", type=Path, help="write the table as markdown here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fp8rl-harden-"))
    try:
        rows = api_rows(root) + reward_rows(root) + [data_row(root)]
        if args.ray:
            rows.append(ray_row())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = ["| row | new behaviour | time to detect |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"cpus": os.cpu_count(), "load": os.getloadavg()[0]}
        args.out.write_text(f"# Issue 17: time to detect (CPU, {json.dumps(meta)})\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
