"""``fp8rl mismatch``: rollout↔trainer logprob mismatch for bf16, fp8_rollout and unified_fp8."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def mismatch(
    model: Annotated[
        str, typer.Option(help="model.path: builtin:NAME, random:PRESET, HF dir or .gguf.")
    ] = ("builtin:smollm2-135m-instruct"),
    prompts: Annotated[
        Path | None,
        typer.Option(
            help="Text file, one prompt per line, or .jsonl with "
            "a 'question' field (default: 8 arithmetic problems)."
        ),
    ] = None,
    num_prompts: Annotated[int, typer.Option(min=1, help="Prompts to use.")] = 8,
    n: Annotated[int, typer.Option(min=1, help="Samples per prompt.")] = 2,
    max_tokens: Annotated[int, typer.Option(min=1, help="Response length.")] = 32,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature.")] = 1.0,
    exact: Annotated[bool, typer.Option(help="Batch-invariant kernels (precision.exact).")] = True,
    modes: Annotated[
        str, typer.Option(help="Comma-separated precision modes.")
    ] = "bf16,fp8_rollout,unified_fp8",
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the results as JSON.")
    ] = None,
) -> None:
    """Generate with the engine and score the same token ids with the trainer forward, per mode."""
    import torch
    from pydantic import ValidationError
    from rich.console import Console
    from rich.table import Table

    from fp8rl.protocol import ModelSpec, PrecisionSpec, SamplingParams
    from fp8rl.services.commands.common import fail
    from fp8rl.services.mismatch import MODES, measure_mode
    from fp8rl.workers.model.loading import load_tokenizer, resolve_model

    chosen = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [m for m in chosen if m not in MODES]
    if bad:
        raise fail(f"--modes: unknown {bad}; choose from {list(MODES)}")
    try:
        spec = ModelSpec(path=model, max_model_len=512)
        source = resolve_model(spec.path)
        tokenizer = load_tokenizer(source.tokenizer_dir)
    except ValidationError as exc:
        raise fail(f"--model: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    except (ValueError, FileNotFoundError) as exc:
        raise fail(f"--model: {exc}") from None
    texts = _prompts(prompts, num_prompts)
    ids = [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
        for t in texts
    ]
    ids = [list(i["input_ids"] if hasattr(i, "keys") else i) for i in ids]
    sampling = SamplingParams(n=n, temperature=temperature, max_tokens=max_tokens, seed=seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    console = Console()
    table = Table(
        title=f"rollout vs trainer logprobs — {model}, exact={exact}, {len(ids)}×{n} samples"
    )
    for col in ("mode", "tokens", "token_mult_prob_error", "kl_k3", "|Δlogp| max", "|Δlogp| mean"):
        table.add_column(col, justify="right")
    reports = []
    for mode in chosen:
        with console.status(f"{mode}: generating and scoring"):
            report = measure_mode(
                source, spec, PrecisionSpec(mode=mode, exact=exact), ids, sampling, device=device
            )
        reports.append(report)
        m = report.metrics
        table.add_row(
            mode,
            str(report.num_tokens),
            f"{m['mismatch/token_mult_prob_error']:.8f}",
            f"{m['mismatch/kl_k3']:.3e}",
            f"{m['mismatch/abs_dlogp_max']:.3e}",
            f"{m['mismatch/abs_dlogp_mean']:.3e}",
        )
    console.print(table)
    if json_out:
        json_out.write_text(json.dumps([r.__dict__ for r in reports], indent=2))


def _prompts(path: Path | None, count: int) -> list[str]:
    if path is None:
        from fp8rl.protocol import ArithmeticDataset
        from fp8rl.services.data import generate_arithmetic

        return [
            f"What is {r.question}? Reply with just the number."
            for r in generate_arithmetic(ArithmeticDataset(difficulty=2, num_problems=count))
        ]
    from fp8rl.services.commands.common import fail

    if not path.exists():
        raise fail(f"--prompts: {path} does not exist")
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    if path.suffix == ".jsonl":
        lines = [json.loads(ln)["question"] for ln in lines]
    return lines[:count]


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""
    app.command()(mismatch)
