"""The SGLang API contract: the fake engine and the worker's calls against SGLang 0.5.23's source.

The committed snapshot (``sglang-0.5.23-api.json``) is what ``sglang_api.extract_api`` reads
from the real wheel with ``ast``; ``test_snapshot_matches_the_real_wheel`` re-reads the wheel
(downloaded with pip, or ``$FP8RL_SGLANG_WHEEL``) so the snapshot cannot drift from it.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from sglang_api import (
    ENGINE_METHODS,
    RULES,
    SNAPSHOT,
    call_problems,
    download,
    engine_calls,
    extract_api,
    signature_problems,
    unpack,
)

from fp8rl.protocol import SamplingParams, SGLangRollout
from fp8rl.workers.rollout import sglang as worker_module
from fp8rl.workers.rollout.sglang_adapter import PROBE_LOADER, sampling_params, server_args
from fp8rl.workers.rollout.sglang_fake import SERVER_ARGS, FakeSGLangEngine


@pytest.fixture(scope="module")
def api() -> dict:
    return json.loads(SNAPSHOT.read_text())


def test_fake_engine_methods_have_the_real_signatures(api):
    assert signature_problems(FakeSGLangEngine, api) == []


def test_signature_check_fails_when_sglang_renames_a_parameter(api):
    drifted = copy.deepcopy(api)
    drifted["engine"]["update_weights_from_tensor"][2][0] = "flush"
    problems = signature_problems(FakeSGLangEngine, drifted)
    assert len(problems) == 1 and "update_weights_from_tensor" in problems[0]


def test_signature_check_fails_when_sglang_drops_a_method(api):
    drifted = copy.deepcopy(api)
    drifted["engine"]["begin_weight_update"] = None
    assert signature_problems(FakeSGLangEngine, drifted) == [
        "Engine.begin_weight_update does not exist in sglang 0.5.23"
    ]


def test_worker_calls_only_checked_engine_methods_with_real_keywords(api):
    calls = engine_calls(Path(worker_module.__file__).read_text())
    assert {c[0] for c in calls} <= set(ENGINE_METHODS)
    assert {"begin_weight_update", "end_weight_update", "update_weights_from_tensor"} <= {
        c[0] for c in calls
    }
    assert call_problems(calls, api) == []


def test_call_check_fails_on_an_unknown_keyword(api):
    calls = engine_calls("self.engine.update_weights_from_tensor(x, weight_version='1')")
    assert call_problems(calls, api) == [
        "engine.update_weights_from_tensor: no parameter 'weight_version'"
    ]


def test_server_args_are_real_sglang_fields_and_values(api):
    kwargs = server_args(
        SGLangRollout(), model_dir="/m", dtype="bfloat16", max_model_len=64,
        kv_fp8=True, fp8=True, seed=0,
    )  # fmt: skip
    assert set(kwargs) == SERVER_ARGS
    assert not SERVER_ARGS - set(api["server_args"])
    assert kwargs["load_format"] in api["load_formats"]
    assert kwargs["quantization"] in api["quantizations"]
    assert kwargs["custom_weight_loader"] == [PROBE_LOADER]


def test_sampling_params_are_real_sglang_fields(api):
    keys = set(sampling_params(SamplingParams(seed=3), [2], index=1))
    assert keys <= set(api["sampling_params"])
    assert "sampling_seed" in keys


def test_the_snapshot_records_every_source_fact_the_fake_copies(api):
    assert api["rules"] == RULES


def _wheel(tmp_path: Path) -> Path:
    if os.environ.get("FP8RL_SGLANG_WHEEL"):
        return Path(os.environ["FP8RL_SGLANG_WHEEL"])
    try:
        return download(tmp_path, timeout=180)
    except (RuntimeError, OSError) as exc:
        pytest.skip(f"the sglang wheel is not reachable here ({exc}); set FP8RL_SGLANG_WHEEL")


def test_snapshot_matches_the_real_wheel(tmp_path, api):
    wheel = _wheel(tmp_path)
    real = extract_api(unpack(wheel, tmp_path / "src"))
    committed = {k: v for k, v in api.items() if k != "wheel"}
    assert real == committed, "sglang_api.py WHEEL rewrites the snapshot; review the diff"
