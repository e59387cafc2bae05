"""The exact-mode Triton kernels (attention, dense head, log-softmax) on CPU through
TRITON_INTERPRET=1: indexing, masks, the GQA fold, decode rows equal to full-sequence rows over
larger caches, gradients against float64 (the GPU's rounding: test_exact_triton_gpu.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
CASES = Path(__file__).with_name("exact_interpreter_cases.py")


@pytest.fixture(scope="module")
def fields() -> dict[str, dict[str, str]]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, str(CASES)], env=env, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return {
        line.split()[0]: dict(re.findall(r"(\w+)=(\S+)", line)) for line in run.stdout.splitlines()
    }


def test_attention_forward_is_close_to_float64(fields):
    assert float(fields["attn_fwd"]["err"]) < 5e-3


def test_decode_rows_equal_full_sequence_rows_over_larger_caches(fields):
    assert fields["attn_decode"]["same"] == "True"


def test_visible_counts_past_the_keys_given_act_as_the_keys_given(fields):
    assert fields["attn_clamp"]["same"] == "True"


@pytest.mark.parametrize("late_v", [False, True])
def test_an_fp8_cache_read_in_place_gives_the_trainers_rows_with_v_dequantized_early_or_late(
    fields, late_v
):
    assert fields[f"attn_fp8_cache_late_v_{late_v}"]["same"] == "True"


@pytest.mark.parametrize("grad", ["attn_dq", "attn_dk", "attn_dv"])
def test_attention_gradients_are_close_to_float64(fields, grad):
    assert float(fields[grad]["rel"]) < 5e-3


def test_dense_gemm_and_logprobs_are_row_invariant_and_close_to_float64(fields):
    assert fields["gemm"]["same"] == "True" and float(fields["gemm"]["err"]) < 5e-3
    assert fields["logprob"]["same"] == "True" and float(fields["logprob"]["err"]) < 1e-5


@pytest.mark.parametrize(
    ("case", "dtype", "bound"), [("float32", "float32", 1e-5), ("float16", "float16", 2e-3)]
)
def test_logprob_gradient_is_close_to_float64_in_the_logits_dtype(fields, case, dtype, bound):
    got = fields[f"logprob_grad_{case}"]
    assert float(got["rel"]) < bound and got["dtype"] == f"torch.{dtype}"


def test_entropy_rows_keep_the_plain_logprobs_and_are_close_to_float64(fields):
    got = fields["entropy"]
    assert got["logp_same"] == "True"
    assert float(got["err"]) < 1e-5 and float(got["grad_rel"]) < 1e-5


def test_ids_outside_the_vocabulary_score_nan_and_a_one_hot_row_has_zero_entropy(fields):
    assert fields["edges"]["outside_nan"] == "True"
    assert float(fields["edges"]["one_hot_entropy"]) == 0.0
