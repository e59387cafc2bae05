"""Reward curves of the quickstart in the three precision modes (outside CI: ~20 min per mode on 2 cores).

    python benchmarks/quickstart_curves.py --runs runs/curves            # run the three modes, then plot
    python benchmarks/quickstart_curves.py --runs runs/curves --plot-only

Each mode runs ``deploy/jobs/quickstart.yaml`` with the overrides below (30 steps, 4 prompts × 4
samples, 8-token answers, lr 1e-5) and writes ``<runs>/curve-<mode>/metrics.jsonl``; the plot and
a table go to ``--out`` (default docs/results/).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

MODES = ("bf16", "fp8_rollout", "unified_fp8")
OVERRIDES = [
    "steps=30",
    "rollout.max_tokens=8",
    "trainer.lr=1e-5",
    "data.prompts_per_step=4",
    "rollout.n=4",
    "logging.backends=[jsonl]",
]


def run_mode(mode: str, runs: Path, repo: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "fp8rl.services.driver",
            str(repo / "deploy/jobs/quickstart.yaml"),
            f"name=curve-{mode}",
            f"precision.mode={mode}",
            f"output_dir={runs}",
            *OVERRIDES,
        ],
        check=True,
    )


def load(runs: Path, mode: str) -> list[dict]:
    path = runs / f"curve-{mode}" / "metrics.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if "reward/mean" in r]


def smooth(values: list[float], window: int = 5) -> list[float]:
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
        for i in range(len(values))
    ]


def plot(runs: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_m) = plt.subplots(1, 2, figsize=(11, 4))
    lines = [
        "| mode | reward, steps 1-5 | reward, steps 26-30 | token_mult_prob_error (mean) | max abs dlogp (max) |",
        "|---|---|---|---|---|",
    ]
    for mode in MODES:
        rows = load(runs, mode)
        steps = [r["step"] for r in rows]
        reward = [r["reward/mean"] for r in rows]
        ax_r.plot(steps, reward, alpha=0.25)
        ax_r.plot(steps, smooth(reward), label=mode, color=ax_r.lines[-1].get_color())
        mult = [r["mismatch/token_mult_prob_error"] for r in rows]
        ax_m.plot(steps, mult, label=mode)
        lines.append(
            f"| {mode} | {sum(reward[:5]) / 5:.3f} | {sum(reward[-5:]) / 5:.3f} | "
            f"{sum(mult) / len(mult):.4f} | {max(r['mismatch/abs_dlogp_max'] for r in rows):.3g} |"
        )
    ax_r.set(
        title="quickstart reward (SmolLM2-135M, arithmetic)",
        xlabel="step",
        ylabel="reward/mean (5-step mean)",
    )
    ax_m.set(
        title="rollout vs trainer mismatch",
        xlabel="step",
        ylabel="token_mult_prob_error (1 = none)",
    )
    for ax in (ax_r, ax_m):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "quickstart-curves.png", dpi=110)
    (out / "quickstart-curves-table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("runs/curves"))
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "results"
    )
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    if not args.plot_only:
        for mode in MODES:
            run_mode(mode, args.runs, Path(__file__).resolve().parents[1])
    plot(args.runs, args.out)


if __name__ == "__main__":
    main()
