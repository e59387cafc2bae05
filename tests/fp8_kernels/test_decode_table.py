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


def test_decode_gemm_is_off_by_default_for_fast_mode_parity():
    """Its rows differ from the trainer's scaled_mm FProp (fast-mode mismatch 1.034 vs 1.000 on
    small-llama, H200): the fast path runs it only after ``set_enabled(True)``."""
    assert not dec.decode_wins(32, 1024, 256)
    previous = dec.set_enabled(True)
    try:
        assert previous is False and dec.decode_wins(32, 1024, 256)
    finally:
        dec.set_enabled(previous)
    assert not dec.decode_wins(32, 1024, 256)
