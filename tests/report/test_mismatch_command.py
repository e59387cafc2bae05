"""``fp8rl mismatch`` streams: each mode's row and JSON appear as soon as that mode is done."""

from __future__ import annotations

import json

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
