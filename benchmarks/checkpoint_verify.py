"""Cost of checkpoint integrity on CPU: sha256 of every file at save, verification at resume.

    python benchmarks/checkpoint_verify.py --size-gb 1 --files 1 4 --out benchmarks/results

Writes ``--files`` random files totalling ``--size-gb`` into a temporary step directory (like a
driver-written checkpoint with 1 file, or rank-written shards with several), then times:

* ``hash``: ``hash_directory`` (what ``commit_checkpoint`` adds to a save);
* ``verify``: ``verify_checkpoint`` with checksums (what a resume adds before loading);
* ``sizes``: ``verify_checkpoint(checksums=False)`` (the quick check pruning and reports use).

Files are read from the page cache (just written): the numbers are the hashing cost, a lower bound
on a cold read, which storage bandwidth bounds instead. Wall and CPU seconds per GB (CPU sums all
hashing threads) are printed as a table; ``--out`` writes JSON + Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from fp8rl.protocol import QuantConfig
from fp8rl.services.checkpoint import META, verify_checkpoint
from fp8rl.services.checkpoint_manifest import CheckpointMeta
from fp8rl.services.checkpoint_verify import MAX_HASH_THREADS, FileRecord, hash_directory

GB = 1e9


def write_files(step_dir: Path, *, total_bytes: int, num_files: int) -> None:
    """``num_files`` files of random bytes summing to ``total_bytes`` (one 64 MiB block reused)."""
    block = os.urandom(64 * 2**20)
    per_file = total_bytes // num_files
    for i in range(num_files):
        with open(step_dir / f"shard_{i:03d}.bin", "wb") as f:
            left = per_file
            while left > 0:
                f.write(block[: min(left, len(block))])
                left -= len(block)


def write_manifest(step_dir: Path, files: dict[str, FileRecord]) -> None:
    """A minimal valid ``meta.json`` recording ``files`` (the other fields are placeholders)."""
    quant = QuantConfig()
    meta = CheckpointMeta(
        step=1,
        policy_version=1,
        quant_fingerprint=quant.fingerprint(),
        quant=quant,
        precision_mode="unified_fp8",
        model_path="random:tiny-llama",
        decoder_config={},
        master_dtype="float32",
        data_cursor={},
        job={},
        files=files,
        created_at="",
    )
    (step_dir / META).write_text(meta.model_dump_json())


def timed(fn) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(size_gb: float, num_files: int, repeats: int) -> list[dict]:
    """Rows ``{case, files, gb, wall_s, cpu_s, wall_s_per_gb, cpu_s_per_gb}`` (best of repeats)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="fp8rl-ckpt-bench-") as tmp:
        step_dir = Path(tmp) / "step_1"
        step_dir.mkdir()
        write_files(step_dir, total_bytes=int(size_gb * GB), num_files=num_files)
        files = hash_directory(step_dir, exclude=(META,))
        write_manifest(step_dir, files)
        gb = sum(r.size for r in files.values()) / GB
        cases = {
            "hash": lambda: hash_directory(step_dir, exclude=(META,)),
            "verify": lambda: verify_checkpoint(step_dir),
            "sizes": lambda: verify_checkpoint(step_dir, checksums=False),
        }
        for case, fn in cases.items():
            wall, cpu = min(timed(fn) for _ in range(repeats))
            rows.append(
                {
                    "case": case,
                    "files": num_files,
                    "gb": round(gb, 3),
                    "wall_s": round(wall, 4),
                    "cpu_s": round(cpu, 4),
                    "wall_s_per_gb": round(wall / gb, 4),
                    "cpu_s_per_gb": round(cpu / gb, 4),
                }
            )
    return rows


def markdown(rows: list[dict], header: str) -> str:
    """The rows as a Markdown table under ``header``."""
    keys = list(rows[0])
    lines = [header, "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="total bytes hashed (GB)")
    parser.add_argument("--files", type=int, nargs="+", default=[1, 4], help="file counts")
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs")
    parser.add_argument("--out", type=Path, help="directory for JSON + Markdown results")
    args = parser.parse_args()
    rows = [r for n in args.files for r in measure(args.size_gb, n, args.repeats)]
    load = os.getloadavg()[0]
    header = (
        f"checkpoint verification on CPU ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, up to {MAX_HASH_THREADS} hashing threads, page cache warm, "
        f"load average {load:.1f} at the end: wall seconds include waiting for a core when the "
        "load exceeds the core count; CPU seconds do not)"
    )
    table = markdown(rows, header)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "checkpoint-verify-cpu.json").write_text(json.dumps(rows, indent=2) + "\n")
        (args.out / "checkpoint-verify-cpu.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
