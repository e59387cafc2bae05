"""``fp8rl report``: PNG plots and a one-page Markdown/HTML summary of a run directory.

Reads only the run directory (``metrics.jsonl``, ``curves.jsonl``, ``validation.jsonl``,
``generations.jsonl``, ``job.yaml``, ``run_info.json``, ``checkpoints/``), so it works on a run
that is still going, one that crashed, or one copied off a cluster. Rows of the same step
(training metrics, then validation metrics; or a step logged again) merge into one, later values
winning.

Plots (``<run_dir>/report/``): reward (+ validation accuracy), response length, the mismatch
metrics over steps (DESIGN.md §6), the mismatch over response position for a few steps, time
per phase, and tokens/s. Matplotlib runs headless (Agg). The HTML page embeds the PNGs, so it is
one self-contained file.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from fp8rl.services.checkpoint import CHECKPOINTS, checkpoint_steps, latest_checkpoint

log = logging.getLogger(__name__)

MISMATCH_KEYS = (
    "mismatch/token_mult_prob_error",
    "mismatch/kl_k3",
    "mismatch/abs_dlogp_max",
    "mismatch/abs_dlogp_mean",
)
FINAL_KEYS = (
    "reward/mean",
    "response_length/mean",
    "response_length/clip_ratio",
    *MISMATCH_KEYS,
    "actor/pg_loss",
    "actor/kl",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
    "policy_version",
    "timing_s/step",
    "perf/tokens_per_s",
)


class RunData:
    """Everything the report reads from a run directory (missing files read as empty).

    Raises:
        FileNotFoundError: ``run_dir`` is missing, has no ``metrics.jsonl``, or no step ran
            (``metrics.jsonl`` holds no row).
    """

    def __init__(self, run_dir: Path) -> None:
        if not run_dir.is_dir():
            raise FileNotFoundError(f"{run_dir} does not exist or is not a directory")
        if not (run_dir / "metrics.jsonl").exists():
            raise FileNotFoundError(
                f"{run_dir} has no metrics.jsonl: not an fp8rl run directory (or no step ran)"
            )
        self.run_dir = run_dir
        by_step: dict[int, dict[str, Any]] = {}
        for row in read_jsonl(run_dir / "metrics.jsonl"):  # validation rows share the step
            by_step.setdefault(row["step"], {}).update(row)
        if not by_step:
            raise FileNotFoundError(
                f"{run_dir}/metrics.jsonl has no step: no step ran (yet: the run is starting, "
                "or it failed or was stopped before step 1), so there is nothing to report"
            )
        self.metrics = [by_step[s] for s in sorted(by_step)]
        self.curves: dict[int, list[float]] = {
            row["step"]: row["values"]
            for row in read_jsonl(run_dir / "curves.jsonl")
            if row.get("name") == "mismatch_by_position"
        }
        self.validation = read_jsonl(run_dir / "validation.jsonl")
        self.generations = read_jsonl(run_dir / "generations.jsonl")
        job = run_dir / "job.yaml"
        self.job: dict[str, Any] = yaml.safe_load(job.read_text()) if job.exists() else {}
        info = run_dir / "run_info.json"
        self.info: dict[str, Any] = json.loads(info.read_text()) if info.exists() else {}
        fingerprint = run_dir / "quant_fingerprint"
        self.fingerprint = fingerprint.read_text().strip() if fingerprint.exists() else "unknown"

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of metric ``key`` where it was logged with a finite value."""
        points = [(r["step"], r[key]) for r in self.metrics if r.get(key) is not None]
        return [p[0] for p in points], [p[1] for p in points]

    def keys(self, prefix: str) -> list[str]:
        """Metric names starting with ``prefix`` in the order they were first logged."""
        seen = {k: None for r in self.metrics for k in r if k.startswith(prefix)}
        return list(seen)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file (missing file: []; a torn last line is skipped)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


# --------------------------------------------------------------------------------------------
# plots


def _figure(title: str, rows: int = 1, cols: int = 1, size: tuple[float, float] = (8, 4.5)):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False)
    fig.suptitle(title)
    return fig, axes


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    for ax in fig.axes:  # steps and token positions are integers
        if ax.get_xlabel():
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_reward(data: RunData, path: Path) -> Path:
    """Training reward (mean ± std, min/max) and validation accuracy over steps."""
    fig, axes = _figure("reward and validation accuracy", 1, 2, (11, 4.5))
    ax = axes[0][0]
    steps, mean = data.series("reward/mean")
    _, std = data.series("reward/std")
    if steps:
        ax.plot(steps, mean, marker="o", label="reward/mean")
        if len(std) == len(mean):
            low = [m - s for m, s in zip(mean, std, strict=True)]
            high = [m + s for m, s in zip(mean, std, strict=True)]
            _, lowest = data.series("reward/min")  # the band never leaves the step's rewards
            _, highest = data.series("reward/max")
            if len(lowest) == len(low) and len(highest) == len(high):
                low = [max(a, b) for a, b in zip(low, lowest, strict=True)]
                high = [min(a, b) for a, b in zip(high, highest, strict=True)]
            ax.fill_between(steps, low, high, alpha=0.2, label="± std")
        for key, style in (("reward/min", ":"), ("reward/max", "--")):
            s, v = data.series(key)
            if s:
                ax.plot(s, v, linestyle=style, color="gray", label=key)
        ax.set_xlabel("step")
        ax.set_ylabel("reward")
        ax.legend(fontsize=8)
    else:
        _empty(ax, "no reward logged")
    ax.set_title("training reward")
    ax = axes[0][1]
    val_keys = [k for k in data.keys("val/") if k.endswith("/acc")]
    for key in val_keys:
        s, v = data.series(key)
        ax.plot(s, v, marker="o", label=key)
    if val_keys:
        ax.set_xlabel("step")
        ax.set_ylabel("accuracy (pass@1)")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8)
    else:
        _empty(ax, "no validation metrics logged\n(val/<set>/acc)")
    ax.set_title("validation accuracy")
    return _save(fig, path)


def plot_length(data: RunData, path: Path) -> Path:
    """Response length (mean, max; tokens) and the fraction cut at max_tokens."""
    fig, axes = _figure("response length")
    ax = axes[0][0]
    for key, style in (("response_length/mean", "-"), ("response_length/max", "--")):
        s, v = data.series(key)
        if s:
            ax.plot(s, v, linestyle=style, marker="o", label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("tokens")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.08)  # room above the max line
    handles, labels = ax.get_legend_handles_labels()
    s, v = data.series("response_length/clip_ratio")
    if s:
        twin = ax.twinx()
        twin.plot(s, v, color="tab:red", alpha=0.6, linestyle=":", label="clip_ratio (right)")
        twin.set_ylabel("fraction cut at max_tokens", color="tab:red")
        twin.set_ylim(-0.02, 1.05)
        more = twin.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    if handles:
        ax.legend(handles, labels, fontsize=8, loc="lower right")
    else:
        _empty(ax, "no response lengths logged")
    return _save(fig, path)


def plot_mismatch(data: RunData, path: Path) -> Path:
    """The four per-step mismatch metrics (rollout vs trainer logprobs of the same tokens)."""
    fig, axes = _figure("training-inference mismatch per step", 2, 2, (10, 6))
    ideal = {"mismatch/token_mult_prob_error": 1.0}
    for ax, key in zip([a for row in axes for a in row], MISMATCH_KEYS, strict=True):
        s, v = data.series(key)
        if s:
            ax.plot(s, v, marker="o")
            if key in ideal:
                ax.axhline(ideal[key], color="gray", linestyle=":", label="perfect")
            if all(x == ideal.get(key, 0.0) for x in v):
                ax.text(
                    0.5,
                    0.75,
                    "identical logprobs at every step",
                    ha="center",
                    transform=ax.transAxes,
                    color="tab:green",
                )
            ax.set_xlabel("step")
            ax.ticklabel_format(axis="y", useOffset=False)
        else:
            _empty(ax, "not logged")
        ax.set_title(key, fontsize=10)
    return _save(fig, path)


def spread(items: list[int], count: int) -> list[int]:
    """Up to ``count`` items evenly spaced over ``items``, always the first and the last."""
    if len(items) <= count:
        return list(items)
    return [items[round(i * (len(items) - 1) / (count - 1))] for i in range(count)]


def plot_mismatch_by_position(data: RunData, path: Path, *, max_curves: int = 6) -> Path:
    """Mean |Δlogp| over response position for up to ``max_curves`` evenly spaced steps."""
    import matplotlib.pyplot as plt

    fig, axes = _figure("mismatch over response position (mean |logp_train − logp_rollout|)")
    ax = axes[0][0]
    steps = sorted(data.curves)
    if steps:
        picked = spread(steps, max_curves)
        colors = plt.get_cmap("viridis")
        for i, step in enumerate(picked):
            values = data.curves[step]
            color = colors(i / max(1, len(picked) - 1))
            ax.plot(range(len(values)), values, color=color, label=f"step {step}")
        ax.set_xlabel("response position (token)")
        ax.set_ylabel("mean |Δlogp|")
        ax.legend(fontsize=8)
    else:
        _empty(ax, "no per-position curves logged")
    return _save(fig, path)


def disjoint_phases(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Per phase, (step, seconds) of the top-level phases of each step, plus ``other``.

    Top-level phases are ``timing_s/<phase>`` (one slash); ``timing_s/<phase>/<part>`` are parts
    of one of them and left out, so nothing is counted twice. ``other`` is the step's wall time
    (``timing_s/step``) minus the phases: the stacked phases add up to the wall time.
    """
    out: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        phases = {
            k.split("/", 1)[1]: v
            for k, v in row.items()
            if k.startswith("timing_s/") and k.count("/") == 1 and k != "timing_s/step"
            and v is not None
        }  # fmt: skip
        wall = row.get("timing_s/step")
        if wall is not None and phases:
            phases["other"] = max(0.0, wall - sum(phases.values()))
        for name, seconds in phases.items():
            out.setdefault(name, []).append((row["step"], seconds))
    return out


def plot_timing(data: RunData, path: Path) -> Path:
    """Seconds per phase of each step (stacked, disjoint phases) with the whole step's time."""
    fig, axes = _figure("time per phase")
    ax = axes[0][0]
    phases = disjoint_phases(data.metrics)
    if phases:
        bottom: dict[int, float] = {}
        for name, points in phases.items():
            s, v = [p[0] for p in points], [p[1] for p in points]
            ax.bar(s, v, bottom=[bottom.get(x, 0.0) for x in s], label=name)
            for x, y in zip(s, v, strict=True):
                bottom[x] = bottom.get(x, 0.0) + y
        s, v = data.series("timing_s/step")
        if s:
            ax.plot(s, v, color="black", marker="o", label="step (wall)")
        ax.set_xlabel("step")
        ax.set_ylabel("seconds")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        _empty(ax, "no timings logged")
    return _save(fig, path)


def plot_throughput(data: RunData, path: Path) -> Path:
    """Response tokens per second of wall time per step."""
    fig, axes = _figure("throughput")
    ax = axes[0][0]
    s, v = data.series("perf/tokens_per_s")
    if s:
        ax.plot(s, v, marker="o")
        ax.set_xlabel("step")
        ax.set_ylabel("response tokens / s")
        ax.set_ylim(bottom=0)
    else:
        _empty(ax, "no throughput logged")
    return _save(fig, path)


PLOTS: dict[str, Callable[[RunData, Path], Path]] = {
    "reward.png": plot_reward,
    "response_length.png": plot_length,
    "mismatch.png": plot_mismatch,
    "mismatch_by_position.png": plot_mismatch_by_position,
    "timing.png": plot_timing,
    "throughput.png": plot_throughput,
}
"""File name → plot function; every report writes all of them."""


# --------------------------------------------------------------------------------------------
# summary


def summary_sections(data: RunData) -> list[tuple[str, list[tuple[str, str]]]]:
    """The summary as (section title, [(label, value)]) — rendered to Markdown and HTML."""
    job, last = data.job, (data.metrics[-1] if data.metrics else {})
    precision = job.get("precision", {})
    rollout, dataset = job.get("rollout", {}), job.get("data", {})
    spec = [
        ("name", str(job.get("name", data.run_dir.name))),
        ("model", str(job.get("model", {}).get("path", "?"))),
        ("precision", f"{precision.get('mode', '?')} (exact={precision.get('exact', '?')})"),
        ("algorithm", str(job.get("algorithm", {}).get("advantage_estimator", "?"))),
        ("steps done / planned", f"{len(data.metrics)} / {job.get('steps', '?')}"),
        (
            "batch",
            f"{dataset.get('prompts_per_step', '?')} prompts × n={rollout.get('n', '?')}, "
            f"max_tokens={rollout.get('max_tokens', '?')}",
        ),
        (
            "rollout / trainer",
            f"{rollout.get('backend', '?')} / {job.get('trainer', {}).get('backend', '?')}",
        ),
    ]
    quant = precision.get("quant", {})
    contract = [("fingerprint", data.fingerprint)] + [
        (k, json.dumps(quant[k]))
        for k in (
            "scale_format",
            "bf16_modules",
            "bf16_first_blocks",
            "bf16_last_blocks",
            "kv_cache_dtype",
        )
        if k in quant
    ]
    hw = data.info.get("hardware", {})
    hardware = [(k, str(v)) for k, v in hw.items()] or [("hardware", "not recorded")]
    starts = data.info.get("starts", [])
    if len(starts) > 1:
        hardware.append(
            ("restarts", ", ".join(f"at step {s['start_step'] + 1}" for s in starts[1:]))
        )
    finals = [(k, _fmt(last[k])) for k in FINAL_KEYS if last.get(k) is not None]
    finals += [(k, _fmt(last[k])) for k in data.keys("val/") if last.get(k) is not None]
    root = data.run_dir / CHECKPOINTS
    latest = latest_checkpoint(root, checksums=False)  # sizes only: a report does not hash GBs
    ckpts = [
        ("checkpoints", ", ".join(f"step_{s}" for s in checkpoint_steps(root)) or "none"),
        ("latest", latest.name if latest else "none"),
    ]
    return [
        ("Spec", spec),
        ("Quant contract", contract),
        (f"Final numbers (step {last.get('step', '?')})", finals),
        ("Hardware", hardware),
        ("Checkpoints", ckpts),
    ]


def _md_cell(value: Any) -> str:
    return str(value).replace("|", "\\|")


def _fmt(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _samples(data: RunData) -> tuple[str, list[dict[str, Any]]]:
    rows = data.validation or data.generations
    if not rows:
        return "", []
    step = rows[-1]["step"]
    kind = "validation" if data.validation else "training"
    return f"{kind} samples (step {step})", [r for r in rows if r["step"] == step][:4]


def render_markdown(data: RunData, images: list[Path]) -> str:
    """The one-page Markdown summary (images linked relative to the report directory)."""
    lines = [f"# fp8rl run report: {data.job.get('name', data.run_dir.name)}", ""]
    lines.append(f"Run directory: `{data.run_dir}` — generated {time.strftime('%Y-%m-%d %H:%M')}")
    for title, rows in summary_sections(data):
        lines += ["", f"## {title}", "", "| | |", "|---|---|"]
        lines += [f"| {k} | {_md_cell(v)} |" for k, v in rows]
    lines += ["", "## Plots", ""]
    lines += [f"![{p.stem}]({p.name})" for p in images]
    title, rows = _samples(data)
    if rows:
        from fp8rl.services.tracking import markdown_table

        lines += ["", f"## {title}", "", markdown_table(rows)]
    return "\n".join(lines) + "\n"


def render_html(data: RunData, images: list[Path]) -> str:
    """The same summary as one self-contained HTML page (PNGs embedded as data URIs)."""
    esc = html.escape
    name = esc(str(data.job.get("name", data.run_dir.name)))
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>fp8rl report: {name}</title><style>"
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
        "font-size:13px;text-align:left;vertical-align:top}img{max-width:100%;margin:.5em 0}"
        ".grid{display:grid;grid-template-columns:1fr 1fr;gap:0 2em}</style></head><body>",
        f"<h1>fp8rl run report: {name}</h1><p>Run directory <code>{esc(str(data.run_dir))}</code>"
        f" — generated {time.strftime('%Y-%m-%d %H:%M')}</p><div class='grid'>",
    ]
    for title, rows in summary_sections(data):
        parts.append(f"<div><h2>{esc(title)}</h2><table>")
        parts += [f"<tr><th>{esc(k)}</th><td>{esc(str(v))}</td></tr>" for k, v in rows]
        parts.append("</table></div>")
    parts.append("</div><h2>Plots</h2>")
    for image in images:
        encoded = base64.b64encode(image.read_bytes()).decode()
        parts.append(f"<img alt='{esc(image.stem)}' src='data:image/png;base64,{encoded}'>")
    title, rows = _samples(data)
    if rows:
        parts.append(f"<h2>{esc(title)}</h2><table><tr>")
        parts += [f"<th>{esc(c)}</th>" for c in rows[0]]
        parts.append("</tr>")
        for row in rows:
            cells = "".join(f"<td>{esc(str(row.get(c, '')))}</td>" for c in rows[0])
            parts.append(f"<tr>{cells}</tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


class ReportTargetError(OSError):
    """The report's output directory cannot be created or written."""


def write_report(run_dir: Path, *, out: Path | None = None) -> Path:
    """Render every plot and the Markdown/HTML summary; return the report directory.

    Default ``out``: ``<run_dir>/report``. Raises ``FileNotFoundError`` when ``run_dir`` has no
    ``metrics.jsonl`` or no step ran (nothing is written then), ``ReportTargetError`` (an
    ``OSError``) when ``out`` cannot be made a directory (a file there, no permission).
    """
    data = RunData(Path(run_dir))
    out = Path(out) if out else data.run_dir / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file in the way, a read-only or missing mount
        raise ReportTargetError(f"cannot write the report to {out}: {error.strerror}") from None
    images = []
    for name, plot in PLOTS.items():
        images.append(plot(data, out / name))
        log.info("wrote %s", out / name)
    (out / "report.md").write_text(render_markdown(data, images))
    (out / "report.html").write_text(render_html(data, images))
    return out
