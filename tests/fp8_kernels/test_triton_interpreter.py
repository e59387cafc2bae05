"""The issue-14 Triton kernels on CPU through TRITON_INTERPRET=1 (indexing, masks, split-K
reduction and counter reset; the GPU's rounding is checked by test_fused_gpu.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
CASES = Path(__file__).with_name("interpreter_cases.py")


@pytest.fixture(scope="module")
def lines() -> list[str]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, str(CASES)], env=env, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.splitlines()


def _fields(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", line))


def test_decode_gemm_split_k_matches_the_emulation_and_resets_its_counters(lines):
    decode = [_fields(line) for line in lines if line.startswith("decode")]
    assert {d["split"] for d in decode} == {"1", "2", "4"}
    for d in decode:
        assert float(d["err"]) < 1e-6, d
        assert d["locks"] == "0", d


def test_decode_gemm_prologue_quant_equals_the_quantized_input_path(lines):
    for line in lines:
        if line.startswith("decode"):
            assert _fields(line)["same"] == "True", line


def test_decode_gemm_loop_variants_equal_the_plain_loop(lines):
    loops = [_fields(line) for line in lines if line.startswith("loop")]
    assert {(d["bm"], d["ahead"], d["trip"]) for d in loops} == {
        ("64", "1", "1"),
        ("64", "0", "2"),
        ("64", "1", "2"),
        ("64", "0", "4"),
        ("64", "1", "4"),
        ("128", "1", "2"),
    }
    for d in loops:
        assert d["same"] == "True" and d["scales"] == "True", d


def test_decode_gemm_trip_blocks_past_the_last_add_zero_even_after_an_overflow(lines):
    over = [_fields(line) for line in lines if line.startswith("overflow")]
    assert len(over) == 4 and all(d["nan"] == "False" for d in over), over


def test_decode_gemm_takes_an_empty_split_and_an_empty_k(lines):
    d = _fields(next(line for line in lines if line.startswith("emptysplit")))
    assert float(d["err"]) < 1e-6 and d["k0_zero"] == "True", d


def test_fused_norm_and_swiglu_quant_equal_the_unfused_ops(lines):
    norm = _fields(next(line for line in lines if line.startswith("norm")))
    silu = _fields(next(line for line in lines if line.startswith("silu")))
    assert norm["residual_same"] == "True"
    assert float(norm["scale_err"]) < 1e-5 and float(silu["scale_err"]) < 1e-5
    assert float(norm["codes_diff"]) < 1e-3 and float(silu["codes_diff"]) < 1e-3


def test_rope_kv_write_equals_the_torch_rope_and_cache_scatter(lines):
    rope = _fields(next(line for line in lines if line.startswith("rope")))
    assert rope["same"] == "True" and rope["cache_same"] == "True", rope
    assert rope["fp8_untouched"] == "True", rope
    assert float(rope["fp8_equal"]) > 0.8, rope


def test_fp8_transpose_is_a_bitwise_copy_with_ragged_edges(lines):
    cases = [_fields(line) for line in lines if line.startswith("transpose")]
    assert len(cases) == 4
    for case in cases:
        assert case["same"] == "True", case


@pytest.mark.parametrize(("dtype", "bound"), [("float32", 1e-6), ("float16", 2e-3)])
def test_fast_norm_and_swiglu_backward_kernels_match_float64_autograd(lines, dtype, bound):
    got = next(_fields(line) for line in lines if line.startswith(f"fused_bwd dtype={dtype}"))
    assert got["dtypes"] == "True"
    assert all(float(got[k]) < bound for k in ("dx", "dw", "dgate", "dup")), got


def test_fast_norm_and_swiglu_backward_run_the_kernels_and_equal_the_torch_gradients(lines):
    got = next(_fields(line) for line in lines if line.startswith("fused_bwd_autograd"))
    assert got["kernel_calls"] == "2,0"  # switched on: both kernels; off: neither
    assert float(got["rel"]) < 1e-6
