"""Peak memory of a command and all its descendant processes (the driver, Ray's raylet/GCS and
the worker actors), sampled from /proc every ``--interval`` seconds. Linux only.

    python benchmarks/quickstart_memory.py [--out FILE.json] -- .venv/bin/fp8rl run deploy/jobs/quickstart.yaml

Reports the peak of the summed PSS (proportional set size: shared pages split between the
processes that map them, so the sum is the real footprint) and of the summed RSS (which counts
shared pages once per process, an upper bound), the per-process PSS at the PSS peak, and the
wall time. Exit code: the command's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def descendants(root: int, sessions: set[int]) -> list[int]:
    """``root``, every process below it (by parent pid), and every process of a session in
    ``sessions`` and below it. Sessions that descendants lead are added to ``sessions``: a
    private Ray head's processes are orphaned when ``ray start`` (no ``--block``) returns, and
    stay findable by the session id it created."""
    children: dict[int, list[int]] = {}
    members: list[int] = []
    leaders: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            ppid, sid = int(fields[1]), int(fields[3])
        except (OSError, IndexError, ValueError):
            continue
        pid = int(entry.name)
        children.setdefault(ppid, []).append(pid)
        if sid == pid:
            leaders[pid] = sid
        if sid in sessions:
            members.append(pid)
    found, todo, seen = [], [root, *members], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        found.append(pid)
        if pid in leaders:
            sessions.add(pid)
        todo.extend(children.get(pid, []))
    return found


def memory_kib(pid: int) -> tuple[int, int, str] | None:
    """(PSS KiB, RSS KiB, short command) of one process; None once it is gone."""
    try:
        rollup = (Path("/proc") / str(pid) / "smaps_rollup").read_text()
        cmd = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    fields = {line.split(":")[0]: line.split()[1] for line in rollup.splitlines()[1:]}
    return int(fields.get("Pss", 0)), int(fields.get("Rss", 0)), cmd[:90]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    t0 = time.perf_counter()
    proc = subprocess.Popen(command)
    peak_pss, peak_rss, at_peak = 0, 0, []

    def result() -> dict:
        return {
            "command": " ".join(command),
            "exit_code": proc.returncode,
            "wall_s": round(time.perf_counter() - t0, 1),
            "peak_pss_gib": round(peak_pss / 2**20, 3),
            "peak_rss_sum_gib": round(peak_rss / 2**20, 3),
            "processes_at_pss_peak": [
                {"pss_mib": round(k / 1024, 1), "cmd": c} for k, c in at_peak if k > 10 * 1024
            ],
        }

    sessions: set[int] = set()
    while proc.poll() is None:
        rows = [(pid, m) for pid in descendants(proc.pid, sessions) if (m := memory_kib(pid))]
        pss, rss = sum(m[0] for _, m in rows), sum(m[1] for _, m in rows)
        peak_rss = max(peak_rss, rss)
        if pss > peak_pss:
            peak_pss = pss
            at_peak = sorted(((m[0], m[2]) for _, m in rows), reverse=True)
            if args.out:  # kept current, so a run stopped early still leaves its peak
                args.out.write_text(json.dumps(result(), indent=2) + "\n")
        time.sleep(args.interval)
    text = json.dumps(result(), indent=2)
    print(text, file=sys.stderr)
    if args.out:
        args.out.write_text(text + "\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
