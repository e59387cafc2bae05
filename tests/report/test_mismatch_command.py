"""``fp8rl mismatch``: rows stream per mode; a bad --prompts file or --modes is one clear line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fp8rl.services.cli import app


def test_mismatch_prints_a_row_and_rewrites_the_json_per_mode(tmp_path):
    out = tmp_path / "m.json"
    args = ["mismatch", "--model", "random:tiny-llama", "--num-prompts", "2", "--max-tokens", "4"]
    result = CliRunner().invoke(app, [*args, "--modes", "bf16,unified_fp8", "--json", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    rows = [ln for ln in lines if ln.startswith(("bf16 ", "unified_fp8 "))]
    assert [r.split()[0] for r in rows] == ["bf16", "unified_fp8"]
    assert "[1/2] bf16: generating" in result.output  # progress per mode and phase
    assert lines.index(rows[0]) < lines.index("[2/2] unified_fp8: loading")  # streamed
    assert [r["mode"] for r in json.loads(out.read_text())] == ["bf16", "unified_fp8"]
    assert float(rows[1].split()[2]) == 1.0  # exact unified_fp8: bit-equal logprobs


def test_mismatch_attribute_streams_one_row_per_ingredient_and_the_shares(tmp_path):
    out = tmp_path / "a.json"
    args = ["mismatch", "--model", "random:tiny-llama", "--num-prompts", "2", "--max-tokens", "4"]
    result = CliRunner().invoke(app, [*args, "--attribute", "--json", str(out)])
    assert result.exit_code == 0, result.output
    names = [r["mode"] for r in json.loads(out.read_text())]
    assert names == ["weights", "activations", "kv_cache", "kernels", "fp8_all"]
    share_line = next(ln for ln in result.output.splitlines() if ln.startswith("share of"))
    shares = [float(w.rstrip("%")) for w in share_line.split()[4::2]]
    assert len(shares) == 4 and abs(sum(shares) - 100.0) < 0.5


QUICK = ["mismatch", "--model", "random:tiny-llama", "--num-prompts", "1", "--max-tokens", "2"]


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        # MATH-500's rows: the prompt is under 'problem'
        ("math.jsonl", '{"problem": "1+1?", "answer": "2"}\n', "'question'"),
        ("empty.jsonl", "", "has no"),
        ("blank.txt", "\n  \n", "has no prompts"),
        ("number.jsonl", '{"question": 5}\n', "'question' must be a non-empty string, got int 5"),
        ("bad.jsonl", "{oops\n", "not valid JSON"),
        ("prompts.json", '["2+2?"]\n', "a .json file is not read"),
    ],
)
def test_a_bad_prompts_file_is_one_line_naming_the_option_the_file_and_the_problem(
    tmp_path, name, content, problem
):
    path = tmp_path / name
    path.write_text(content)
    result = CliRunner().invoke(app, [*QUICK, "--prompts", str(path)])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"--prompts: {path}") and problem in line, line
    assert "Traceback" not in result.output


def test_a_jsonl_row_lacking_the_prompt_key_lists_its_fields(tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_text('{"problem": "1+1?", "answer": "2"}\n')
    result = CliRunner().invoke(app, [*QUICK, "--prompts", str(path)])
    assert "problem, answer" in result.output


def test_prompt_key_picks_the_field_of_a_jsonl_prompts_file(tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_text('{"problem": "What is 1+1?", "answer": "2"}\n')
    args = [*QUICK, "--prompts", str(path), "--prompt-key", "problem", "--modes", "bf16"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "1×2 samples" in result.output  # one prompt, n=2


@pytest.mark.parametrize("modes", ["", " , ", "bf16,fp4"])
def test_modes_without_a_known_mode_is_an_error_listing_the_modes(modes):
    result = CliRunner().invoke(app, [*QUICK, "--modes", modes])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("--modes: ")
    assert "bf16, fp8_rollout, unified_fp8" in result.output
