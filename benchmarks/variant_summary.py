"""Best time per loop variant of a ``gemm_parity_tune.py`` sweep (its ``gemm-parity.json``).

    python benchmarks/variant_summary.py DIR/gemm-parity.json

One line per (model, layer, M): BF16 and today's µs, then the fastest bitwise candidate of each
(BLOCK_M, scale_ahead, k_trip) variant (named ``BMxAxT``), and how many candidates of the sweep were not bitwise.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def _variant(candidate: dict) -> tuple[int, int, int]:
    """(BLOCK_M, scale_ahead, k_trip) of one timed candidate (``DecodeConfig`` field order)."""
    cfg = candidate["config"]
    return cfg[0], cfg[5], cfg[6]


def main() -> None:
    rows = json.loads(Path(sys.argv[1]).read_text())
    variants = sorted({_variant(c) for r in rows for c in r["all"]})
    names = ["x".join(map(str, v)) for v in variants]
    print("| model | layer | M | BF16 | today | " + " | ".join(names) + " | not bitwise |")
    print("|---" * (6 + len(names)) + "|")
    for r in rows:
        best: dict = defaultdict(lambda: float("inf"))
        for c in r["all"]:
            if c["differ"] == 0:
                best[_variant(c)] = min(best[_variant(c)], c["us"])
        bad = sum(c["differ"] != 0 for c in r["all"])
        cells = " | ".join(f"{best[v]:.1f}" for v in variants)
        print(f"| {r['model']} | {r['layer']} | {r['m']} | {r['bf16_us']:.1f} | "
              f"{r['today_us']:.1f} | {cells} | {bad} |")  # fmt: skip


if __name__ == "__main__":
    main()
