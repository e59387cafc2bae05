"""The decode GEMM's dispatch: the tuned table's shape, its flags, and the untuned fallback."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("triton")
from fp8rl.kernels import gemm_decode_triton as dec


def test_committed_table_rows_are_launchable_configs():
    rows = json.loads(dec.TABLE_PATH.read_text())["configs"]
    assert rows
    for r in rows:
        assert r["m"] == dec.m_bucket(r["m"]) and r["m"] <= dec.MAX_TABLE_ROWS
        assert 16 <= r["block_m"] <= 64 and 128 % r["block_n"] == 0
        assert r["split_k"] in (1, 2, 4, 8) and isinstance(r["prologue"], bool)


@pytest.mark.parametrize("m", [1, 7, 16, 33, 64, 200])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (100, 300), (4096, 14336)])
def test_heuristic_config_fills_the_gpu_without_starving_a_split(m, n, k):
    cfg = dec.heuristic_config(m, n, k)
    assert cfg.block_m == dec.block_m_for(m) and 16 <= cfg.block_m <= 64
    k_blocks = -(-k // 128)
    assert cfg.split_k == 1 or k_blocks // cfg.split_k >= 4


def test_measured_flags_decide_and_unmeasured_shapes_fall_back_to_the_row_range(monkeypatch):
    cfg = dec.DecodeConfig(16, 64, 2)
    table = {
        (16, 512, 256): (cfg, {"prologue": True, "fp8_in": False}),
        (128, 512, 256): (cfg, {"prologue": False, "fp8_in": True}),
    }
    monkeypatch.setattr(dec, "_table", lambda: table)
    assert not dec.decode_wins(100, 512, 256) and not dec.prologue_wins(12, 512, 256)  # default
    monkeypatch.setattr(dec, "_ENABLED", [True])
    assert dec.prologue_wins(12, 512, 256) and not dec.prologue_wins(12, 1024, 256)
    assert not dec.decode_wins(16, 512, 256)  # measured slower than scaled_mm
    assert dec.decode_wins(100, 512, 256)  # measured faster, beyond the default range
    assert dec.decode_wins(32, 1024, 256) and not dec.decode_wins(8, 1024, 256)
    assert not dec.decode_wins(100, 1024, 256)
    assert dec.decode_config(16, 512, 256) == cfg


def test_split_k_decode_gemm_is_off_by_default_for_fast_mode_parity():
    """The speed-tuned (split-K, BLOCK_M < 64) rows differ from the trainer's scaled_mm FProp
    (fast-mode mismatch 1.034 vs 1.000 on small-llama, H200): the fast path runs them, and the
    untuned 16 ≤ M ≤ 64 rule, only after ``set_enabled(True)``."""
    assert not dec.decode_wins(32, 1024, 256)
    previous = dec.set_enabled(True)
    try:
        assert previous is False and dec.decode_wins(32, 1024, 256)
    finally:
        dec.set_enabled(previous)
    assert not dec.decode_wins(32, 1024, 256)


def test_committed_parity_safe_rows_have_the_bitwise_shape():
    table = json.loads(dec.TABLE_PATH.read_text())
    rows = table["parity_safe"]
    assert rows and "parity_safe_tuned" in table
    for r in rows:
        assert r["parity_safe"] is True and isinstance(r["fp8_in"], bool)
        assert r["block_m"] in (64, 128) and r["split_k"] == 1 and r["m"] == dec.m_bucket(r["m"])
    winners = {(r["m"], r["n"], r["k"]) for r in rows if r["fp8_in"]}
    assert set(dec._parity_safe_table()) == winners


def test_only_measured_winning_parity_safe_rows_are_dispatched_by_default(monkeypatch):
    """Default dispatch: a row must be marked parity_safe, have won (fp8_in), and be BLOCK_M ≥ 64
    with split_k 1; the split-K rows stay behind ``set_enabled(True)``."""
    row = {"n": 512, "k": 256, "block_n": 64, "num_warps": 4, "num_stages": 4, "prologue": False}
    safe = [
        {**row, "m": 16, "block_m": 64, "split_k": 1, "parity_safe": True, "fp8_in": True},
        {**row, "m": 32, "block_m": 64, "split_k": 1, "parity_safe": True, "fp8_in": False},
        {**row, "m": 64, "block_m": 64, "split_k": 4, "parity_safe": True, "fp8_in": True},
        {**row, "m": 128, "block_m": 32, "split_k": 1, "parity_safe": True, "fp8_in": True},
        {**row, "m": 256, "block_m": 64, "split_k": 1, "fp8_in": True},
    ]
    configs = [{**row, "m": 32, "block_m": 32, "split_k": 4, "fp8_in": True}]
    monkeypatch.setattr(dec, "_table_json", lambda: {"configs": configs, "parity_safe": safe})
    monkeypatch.setattr(dec, "_table", dec._table.__wrapped__)
    monkeypatch.setattr(dec, "_parity_safe_table", dec._parity_safe_table.__wrapped__)
    monkeypatch.setattr(dec, "_ENABLED", [False])
    assert [m for m in (16, 32, 64, 128, 256) if dec.decode_wins(m, 512, 256)] == [16]
    assert dec.decode_wins(9, 512, 256) and not dec.decode_wins(8, 512, 256)  # bucket 16 only
    assert dec.decode_config(12, 512, 256) == dec.DecodeConfig(64, 64, 1, 4, 4)
    assert dec.decode_config(32, 512, 256) == dec.DecodeConfig(32, 64, 4, 4, 4)  # not dispatched
    monkeypatch.setattr(dec, "_ENABLED", [True])
    assert dec.decode_wins(32, 512, 256)  # the split-K row, opted in
    assert dec.decode_config(16, 512, 256) == dec.heuristic_config(16, 512, 256)


@pytest.mark.parametrize(
    ("field", "fields"),
    [
        ("scale_ahead", (64, 64, 1, 4, 3, 2, 1)),
        ("scale_ahead", (64, 64, 1, 4, 3, -1, 2)),
        ("k_trip", (64, 64, 1, 4, 3, 0, 3)),
        ("k_trip", (64, 64, 1, 4, 3, 0, None)),
        ("k_trip", (64, 64, 1, 4, 3, 0, "4")),
        ("k_trip", (64, 64, 1, 4, 3, 0, True)),
        ("block_n", (64, 256, 1, 4, 3, 0, 1)),  # two weight-scale rows per tile
        ("block_m", (48, 64, 1, 4, 3, 0, 1)),
        ("split_k", (64, 64, 0, 4, 3, 0, 1)),  # an empty grid
        ("num_stages", (64, 64, 1, 4, 0, 0, 1)),
    ],
)
def test_a_config_the_kernel_cannot_run_is_refused_naming_the_field(field, fields):
    with pytest.raises(ValueError, match=f"DecodeConfig.{field} must be"):
        dec.DecodeConfig(*fields)


def test_committed_parity_safe_rows_use_the_kernels_loop_variants():
    rows = json.loads(dec.TABLE_PATH.read_text())["parity_safe"]
    assert rows
    for r in rows:
        cfg = dec._config(r)
        assert cfg.keeps_k_order and cfg.scale_ahead in (0, 1) and cfg.k_trip in (1, 2, 4), r


def test_a_row_whose_tiles_do_not_fit_shared_memory_runs_with_fewer_stages():
    h200 = 232448  # bytes per program (shared_memory_per_block_optin)
    row = dec.DecodeConfig(64, 64, 1, 4, 3, 1, 4)
    assert dec.fit_stages(row, 1, h200) is row  # FP8 codes: 3 x 4 x 16 KB
    assert dec.fit_stages(row, 2, h200) == dec.DecodeConfig(64, 64, 1, 4, 2, 1, 4)  # BF16 input
    assert dec.fit_stages(row, 2, None) is row  # off CUDA nothing is compiled for a limit
    assert dec.fit_stages(dec.DecodeConfig(128, 128, 1, 8, 6, 1, 4), 2, 1024).num_stages == 1
