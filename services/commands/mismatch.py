"""``fp8rl mismatch``: rollout↔trainer logprob mismatch for bf16, fp8_rollout and unified_fp8."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

DEFAULT = {"num_prompts": 4, "n": 2, "max_tokens": 16}
"""The quick default (under a minute on 2 CPU cores for SmolLM2-135M, three modes)."""
FULL = {"num_prompts": 8, "n": 2, "max_tokens": 32}
"""``--full``: the prompt set of docs/results (minutes on CPU)."""
COLUMNS = ("mode", "tokens", "token_mult_prob_error", "kl_k3", "|Δlogp| max", "|Δlogp| mean")


def mismatch(
    model: Annotated[
        str, typer.Option(help="model.path: builtin:NAME, random:PRESET, HF dir or .gguf.")
    ] = "builtin:smollm2-135m-instruct",
    prompts: Annotated[
        Path | None,
        typer.Option(
            help="Text file (one prompt per line), or .jsonl/.parquet file or save_to_disk "
            "directory (prompt in field --prompt-key). Default: arithmetic problems."
        ),
    ] = None,
    prompt_key: Annotated[
        str, typer.Option(help="Field holding the prompt in a --prompts dataset file.")
    ] = "question",
    num_prompts: Annotated[
        int | None, typer.Option(min=1, help="Prompts to use (default 4, --full 8).")
    ] = None,
    n: Annotated[int | None, typer.Option(min=1, help="Samples per prompt (default 2).")] = None,
    max_tokens: Annotated[
        int | None, typer.Option(min=1, help="Response length (default 16, --full 32).")
    ] = None,
    full: Annotated[
        bool, typer.Option("--full", help="The longer measurement of docs/results.")
    ] = False,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature.")] = 1.0,
    exact: Annotated[bool, typer.Option(help="Batch-invariant kernels (precision.exact).")] = True,
    modes: Annotated[
        str,
        typer.Option(
            help="Comma-separated precision modes: bf16, fp8_rollout, unified_fp8 (default: all).",
            show_default=False,
        ),
    ] = "bf16,fp8_rollout,unified_fp8",
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    attribute: Annotated[
        bool,
        typer.Option(
            "--attribute",
            help="Split the FP8 rollout mismatch into weights / activations / KV cache / "
            "kernels (each alone against the BF16 trainer) instead of comparing --modes.",
        ),
    ] = False,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", help="Also write the results as JSON (rewritten after each mode)."),
    ] = None,
) -> None:
    """Measure rollout vs trainer logprob mismatch per precision mode.

    The engine generates; the trainer forward scores the same token ids. Each mode's row is
    printed (and the JSON rewritten) as soon as that mode is done. The defaults (model
    builtin:smollm2-135m-instruct, 4 prompts, 16 tokens) take under a minute on CPU.
    """
    import torch
    from pydantic import ValidationError

    from fp8rl.protocol import ModelSpec, PrecisionSpec, SamplingParams
    from fp8rl.services.commands.common import fail
    from fp8rl.services.mismatch import MODES, measure_mode
    from fp8rl.workers.model.loading import load_tokenizer, resolve_model

    size = (FULL if full else DEFAULT) | {
        k: v for k, v in {"num_prompts": num_prompts, "n": n, "max_tokens": max_tokens}.items()
        if v is not None
    }  # fmt: skip
    chosen = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [m for m in chosen if m not in MODES]
    if bad or not chosen:
        what = f"unknown {', '.join(map(repr, bad))}" if bad else f"no mode in {modes!r}"
        raise fail(f"--modes: {what}; choose from {', '.join(MODES)} (comma-separated)")
    try:
        texts = _prompts(prompts, size["num_prompts"], key=prompt_key)
    except ValueError as exc:
        raise fail(f"--prompts: {exc}") from None
    try:
        spec = ModelSpec(path=model, max_model_len=512)
        source = resolve_model(spec.path)
        tokenizer = load_tokenizer(source.tokenizer_dir)
    except ValidationError as exc:
        raise fail(f"--model: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    except (ValueError, FileNotFoundError) as exc:
        raise fail(f"--model: {exc}") from None
    ids = _prompt_ids(tokenizer, texts)
    sampling = SamplingParams(
        n=size["n"], temperature=temperature, max_tokens=size["max_tokens"], seed=seed
    )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if attribute:
        _attribute(source, spec, PrecisionSpec(exact=exact), ids, sampling, device, json_out)
        return
    _say(f"rollout vs trainer logprobs — {model}, exact={exact}, {len(ids)}×{size['n']} samples")
    _say("  ".join(COLUMNS))
    reports = []
    for i, mode in enumerate(chosen, 1):
        t0 = time.perf_counter()

        def phase(name: str, mode: str = mode, i: int = i) -> None:
            _say(f"[{i}/{len(chosen)}] {mode}: {name}", err=True)

        report = measure_mode(
            source, spec, PrecisionSpec(mode=mode, exact=exact), ids, sampling,
            device=device, on_phase=phase,
        )  # fmt: skip
        reports.append(report)
        _say(f"{row(report)}  ({time.perf_counter() - t0:.1f} s)")
        if json_out:
            json_out.write_text(json.dumps([r.__dict__ for r in reports], indent=2))


def _attribute(source, spec, precision, ids, sampling, device, json_out: Path | None) -> None:
    """``--attribute``: one row per FP8 ingredient as it is measured, then the shares."""
    from fp8rl.services.mismatch_attribution import SHARE_METRIC, attribute, shares

    _say(f"mismatch attribution vs the BF16 trainer (exact={precision.exact}), {len(ids)} prompts")
    _say("  ".join(("ingredient", *COLUMNS[1:])))
    done = []

    def report(r) -> None:
        done.append(r)
        _say(row(r))
        if json_out:
            json_out.write_text(json.dumps([x.__dict__ for x in done], indent=2))

    reports = attribute(
        source, spec, precision, ids, sampling, device=device, on_report=report,
        on_phase=lambda v, p: _say(f"[{v}] {p}", err=True),
    )  # fmt: skip
    parts = [r for r in reports if r.mode != "fp8_all"]
    whole = next(r for r in reports if r.mode == "fp8_all")
    _say(f"share of {SHARE_METRIC}: " + "  ".join(f"{k} {v:.1%}" for k, v in shares(parts).items()))
    total = sum(r.metrics[SHARE_METRIC] for r in parts)
    _say(f"sum of the parts {total:.3e} vs all four together {whole.metrics[SHARE_METRIC]:.3e}")


def row(report) -> str:
    """One mode's line of the table (the columns of ``COLUMNS``)."""
    m = report.metrics
    return "  ".join(
        [
            report.mode,
            str(report.num_tokens),
            f"{m['mismatch/token_mult_prob_error']:.8f}",
            f"{m['mismatch/kl_k3']:.3e}",
            f"{m['mismatch/abs_dlogp_max']:.3e}",
            f"{m['mismatch/abs_dlogp_mean']:.3e}",
        ]
    )


def _say(text: str, *, err: bool = False) -> None:
    """Print and flush at once (progress must show when stdout is a pipe or a file)."""
    print(text, file=sys.stderr if err else sys.stdout, flush=True)


def _prompt_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    ids = [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
        for t in texts
    ]
    return [list(i["input_ids"] if hasattr(i, "keys") else i) for i in ids]


def _prompts(path: Path | None, count: int, *, key: str) -> list[str]:
    """The first ``count`` prompts: arithmetic problems, or those of ``path``.

    ``.jsonl``/``.parquet`` files and ``save_to_disk`` directories are read by the training
    loader (``load_file_dataset``), with the ``key`` field as the prompt; any other file is text,
    one prompt per line.

    Raises:
        ValueError: ``path`` is missing or holds no prompts, or a row of it is not a prompt
            (the message names the file, the row or line and what is wrong).
    """
    if path is None:
        from fp8rl.protocol import ArithmeticDataset
        from fp8rl.services.data import generate_arithmetic

        return [
            f"What is {r.question}? Reply with just the number."
            for r in generate_arithmetic(ArithmeticDataset(difficulty=2, num_problems=count))
        ]
    if not path.exists():
        raise ValueError(f"{path} does not exist")
    if path.suffix == ".json":
        raise ValueError(
            f"{path}: a .json file is not read; give a .jsonl file (one JSON object per line) "
            "or a text file (one prompt per line)"
        )
    if path.is_dir() or path.suffix in (".jsonl", ".parquet"):
        texts = _dataset_prompts(path, count, key=key)
    else:
        texts = _text_prompts(path, count)
    if not texts:
        raise ValueError(f"{path} has no prompts (it is empty or only blank lines)")
    return texts


def _dataset_prompts(path: Path, count: int, *, key: str) -> list[str]:
    """The ``key`` field of the first ``count`` rows, each a non-empty string."""
    from fp8rl.protocol import FileDataset
    from fp8rl.services.data import load_file_dataset

    spec = FileDataset(path=str(path), prompt_key=key, answer_key=key, limit=count)
    try:
        records = load_file_dataset(spec)  # the answer is not needed: answer_key=key
    except ValueError as exc:
        wrong_key = getattr(exc, "field", None) == "prompt_key"
        raise ValueError(
            f"{exc}{'; pick the field with --prompt-key' if wrong_key else ''}"
        ) from None
    for index, record in enumerate(records):
        text = record.row[key]
        if not isinstance(text, str) or not text.strip():
            got = (
                "an empty string"
                if isinstance(text, str)
                else f"{type(text).__name__} {text!r:.40}"
            )
            raise ValueError(f"{path} row {index}: {key!r} must be a non-empty string, got {got}")
    return [record.row[key] for record in records]


def _text_prompts(path: Path, count: int) -> list[str]:
    """The first ``count`` non-blank lines of a UTF-8 text file."""
    texts: list[str] = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if len(texts) == count:
                break
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{path} line {number}: not UTF-8 text (byte {exc.start})"
                ) from None
            if line:
                texts.append(line)
    return texts


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""
    app.command()(mismatch)
