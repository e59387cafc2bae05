"""Decode-size (M ≤ 256) FP8 GEMM ``x · Wᵀ`` with the 1×128 activation quant in its prologue.

Design notes
------------
* At decode sizes the GEMM is a weight stream: the 128×128-block FP8 weight (1 byte/param) is
  read once per step and the activation is tiny (L2-resident). Small tiles (``BLOCK_M`` 16–64,
  ``BLOCK_N`` 32–128) and split-K put enough loads in flight to saturate HBM; a 128×128 tile at
  M = 64 leaves half of each tile idle.
* **Fused quant.** With a BF16/FP32 activation, each program quantizes its ``BLOCK_M × 128``
  activation slice in registers before the ``tl.dot`` (same ``_scale_from_amax``/``_to_codes``
  as ``quant_triton``, so the codes are bitwise those of ``per_token_group_quant``); the
  programs of the first N tile also write the activation scales out, for the finiteness check.
  An already-quantized activation (from the fused norm/SwiGLU kernels) is read as is.
* **Split-K without atomics on the data.** Each K split writes its float32 partial tile to a
  workspace, then bumps a per-tile counter; the program that arrives last sums the partials in
  split order (0, 1, …) and writes the output, then resets the counter. The sum order is fixed,
  so results are deterministic run to run (not batch-invariant: exact mode never runs
  split-K). The counters live in one zeroed buffer per device that every call leaves zeroed,
  which also makes the kernel CUDA-graph safe; calls must not run concurrently on two streams.
* **Config.** ``decode_config(m, n, k)`` looks the (M bucket, N, K) up in the table tuned on the
  H200 (``fp8_gemm_decode_table.json``) and falls back to a heuristic that aims at two programs
  per SM. The table has two lists: ``configs`` (speed-tuned, split-K, ``benchmarks/gemm_tune.py``)
  and ``parity_safe`` (``benchmarks/gemm_parity_tune.py``).
* **Parity.** The trainer's FProp (M = thousands of tokens) runs cuBLASLt ``scaled_mm``, whose
  rows are bitwise the same at any M ≥ 16 for most shapes. A rollout row is parity-safe when it
  is bitwise that row. Measured on the H200 (2026-12-02, every (N, K) of the 8B/7B linears,
  M = 1-256, rows compared with ``scaled_mm`` at M = 4096): ``BLOCK_M`` 64 with ``split_k`` 1
  (wgmma, each 128-wide K block's product scaled and added in K order, as cuBLASLt does) is
  bitwise for every ``BLOCK_N`` (16-128), 4 or 8 warps and 3-6 stages; ``BLOCK_M`` 32 (mma.sync)
  differed in ~6% of outputs and split-K (a sum of per-split partials) in ~0.01%. ``BLOCK_M``
  128 (one warpgroup issuing two 64-row wgmmas, or two warpgroups) was bitwise on every point of
  the 2026-12-04 sweep (M = 128 and 256, all eight shapes).
* **The loop.** Each trip needs the activation's and the weight tile's scales of its K block;
  Triton pipelines the code tiles (``num_stages``) but not these small loads, so a trip that
  loads its own scales waits one global-memory round trip, and a trip's scaling waits for its
  wgmma: ~0.45 µs per K block, whatever the tile (the down projection's 112 K blocks took
  ~55 µs at M = 64). ``scale_ahead`` 1 loads the next trip's scales one trip early;
  ``k_trip`` 2 or 4 issues two or four K blocks' products per trip and adds them in K order.
  Both keep the same operations in the same order (bitwise the plain loop, checked on the H200
  for every (N, K) and M of the sweeps) and took the down projection at M = 64 to ~37 µs
  (2026-12-03, ``k_trip`` 2) and ~30 µs (2026-12-04, ``k_trip`` 4; the o projection ~11 µs).
  ``fit_stages`` lowers ``num_stages`` where a row's tiles would not fit in shared memory (a
  ``k_trip`` 4 row on a BF16 prologue input).
* **Default dispatch: parity-safe rows only.** ``fp8_gemm`` runs this kernel by default only for
  the (M bucket, N, K) whose ``parity_safe`` row was measured bitwise *and* faster than the
  library path by 3%, or where the library's own rows are not bitwise the trainer's
  (``fp8_in``; cuBLASLt's down projection at M = 16, and Qwen's at M = 32, picks another
  kernel than at M = 4096). Measured 2026-12-04: 41 of the 56 points, e.g. o, qkv and down at
  M = 1-64 (1.1-1.8× over the library), o and down at M = 128, the fused gate_up at M = 16-64;
  ``scaled_mm`` keeps M = 256 and the other M = 128 points (128-row tiles did not beat it). The speed-tuned split-K rows
  (faster still, e.g. 2× at M = 1 of down, but not bitwise: fast-mode
  token_mult_prob_error 1.0041 tiny-llama / 1.0344 small-llama with them) and the untuned
  ``MIN_DECODE_ROWS ≤ M ≤ MAX_DECODE_ROWS`` rule run only after ``set_enabled(True)``; the fused
  prologue too. ``set_parity_safe(False)`` turns the default rows off (benchmark baseline).
  Exact mode runs its own rows (below). Results: ``benchmarks/results/issue14/decode-gemm-parity-safe.md``
  and the 2026-12-03 night section of ``benchmarks/results/issue14-h200.md``.
* **Exact mode** (since 2026-12-04) runs this kernel up to M = 256 with ``exact_config``: a
  ``keeps_k_order`` row of the table for the shape (measured bitwise, faster than the library
  or not), else ``EXACT_DEFAULT``. Those rows are bitwise the fixed-tile kernel's rows at any M
  (``tests/fp8_kernels/test_exact_decode_gemm_gpu.py``, every 8B/7B shape and one without a
  table row, M = 1-256 against M = 4096), so the batch invariance holds. The exact 8-layer
  decode at batch 64 went from 24,014 to 38,139 tok/s with it and the fused blocks in exact mode
  (fast mode: 41,428; 2026-12-04).
* **Prologue quant (only after ``set_enabled(True)``).** The prologue quantization is repeated
  by every N tile of a row block, which is free at M ≤ 16 but dominates from M = 64 on
  (0.1-0.4× BF16 there), so ``fp8_linear`` takes the fused-prologue kernel only for the
  (M bucket, N, K) where the table records it beating quantize + library GEMM (``prologue``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import triton
import triton.language as tl
from torch import Tensor

from fp8rl.kernels.quant import GROUP, QuantizedTensor
from fp8rl.kernels.quant_triton import _nan_to_inf_abs, _scale_from_amax, _to_codes

MIN_DECODE_ROWS = 16
"""Smallest M the decode kernel takes an already-quantized activation for (below: tiled kernel;
at M = 1 the H200 sweep measured the decode kernel at half the bandwidth it reaches at M = 16)."""
MAX_DECODE_ROWS = 64
"""Largest M the decode kernel is dispatched for without a measured table flag."""
MAX_TABLE_ROWS = 256
"""Largest M the table is tuned for (a measured ``fp8_in`` flag may enable the kernel up to it)."""

TABLE_PATH = Path(__file__).with_name("fp8_gemm_decode_table.json")
_NUM_SMS = 132
_ENABLED = [False]
"""Whether ``fp8_gemm``/``fp8_linear`` may dispatch to every tuned row (see ``set_enabled``)."""
_PARITY_SAFE = [True]
"""Whether the default fast path runs the measured parity-safe rows (see ``set_parity_safe``)."""
_LOCKS: dict[torch.device, Tensor] = {}
_LOCK_SLOTS = 1 << 16


_ALLOWED = {
    "block_m": (16, 32, 64, 128),
    "block_n": (16, 32, 64, 128),  # ≤ 128: one weight-scale row per N tile
    "num_warps": (1, 2, 4, 8),
    "scale_ahead": (0, 1),
    "k_trip": (1, 2, 4),
}


@dataclass(frozen=True)
class DecodeConfig:
    """Tile and launch parameters of one decode GEMM variant.

    ``scale_ahead`` (0/1): load the next trip's scales one trip early. ``k_trip`` (1/2/4): K
    blocks per loop trip. Neither changes the sum (module doc, "The loop")."""

    block_m: int
    block_n: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 4
    scale_ahead: int = 0
    k_trip: int = 1

    def __post_init__(self) -> None:
        """``ValueError`` naming the first field the kernel cannot run: tiles are powers of two
        of 16-128 (``tl.arange``/``tl.dot``; a ``block_n`` over 128 would span two 128-row
        weight-scale blocks and read one), ``split_k`` and ``num_stages`` positive ints,
        ``scale_ahead`` 0/1 and ``k_trip`` 1/2/4 (the loop variants the kernel has)."""
        for name, value in asdict(self).items():
            allowed = _ALLOWED.get(name)
            if not (type(value) is int and (value in allowed if allowed else value >= 1)):
                choices = f"one of {allowed}" if allowed else "a positive int"
                raise ValueError(f"DecodeConfig.{name} must be {choices}, got {value!r}")

    @property
    def keeps_k_order(self) -> bool:
        """wgmma row tiles (``BLOCK_M`` ≥ 64) and one program per output tile adding the K blocks
        in order (``split_k`` 1): the shape of every config measured bitwise equal to cuBLASLt
        ``scaled_mm`` rows. A table row is dispatched by default only if it has this shape *and*
        was measured bitwise (``parity_safe``)."""
        return self.block_m >= 64 and self.split_k == 1


def m_bucket(m: int) -> int:
    """The table's M key: the next power of two ≥ ``m``."""
    return triton.next_power_of_2(max(m, 1))


def block_m_for(m: int) -> int:
    """Row tile for ``m`` rows: the M bucket clamped to 16..64 (``tl.dot`` needs ≥ 16)."""
    return min(64, max(16, m_bucket(m)))


def _config(row: dict) -> DecodeConfig:
    return DecodeConfig(
        row["block_m"],
        row["block_n"],
        row["split_k"],
        row["num_warps"],
        row["num_stages"],
        row.get("scale_ahead", 0),
        row.get("k_trip", 1),
    )


@functools.cache
def _table_json() -> dict:
    return json.loads(TABLE_PATH.read_text()) if TABLE_PATH.exists() else {}


@functools.cache
def _table() -> dict[tuple[int, int, int], tuple[DecodeConfig, dict]]:
    """The speed-tuned rows (split-K allowed; dispatched only after ``set_enabled(True)``)."""
    return {
        (r["m"], r["n"], r["k"]): (
            _config(r),
            {key: bool(r[key]) for key in ("prologue", "fp8_in") if key in r},
        )
        for r in _table_json().get("configs", [])
    }


@functools.cache
def _parity_safe_table() -> dict[tuple[int, int, int], DecodeConfig]:
    """The rows the fast path runs by default: measured bitwise equal to the trainer's
    ``scaled_mm`` rows (``parity_safe``), faster than the library path (``fp8_in``), and of
    the ``keeps_k_order`` shape."""
    safe = {}
    for r in _table_json().get("parity_safe", []):
        cfg = _config(r)
        if r.get("parity_safe") and r.get("fp8_in") and cfg.keeps_k_order:
            safe[(r["m"], r["n"], r["k"])] = cfg
    return safe


EXACT_DEFAULT = DecodeConfig(
    block_m=64, block_n=64, split_k=1, num_warps=4, num_stages=4, scale_ahead=1, k_trip=2
)
"""Exact mode's config for shapes the table has no parity-safe row for (``keeps_k_order``)."""


@functools.cache
def _exact_table() -> dict[tuple[int, int, int], DecodeConfig]:
    """Every measured-bitwise ``keeps_k_order`` row of the table, faster than the library or
    not (exact mode compares with its fixed-tile kernel, which is slower at these M)."""
    rows = {}
    for r in _table_json().get("parity_safe", []):
        cfg = _config(r)
        if r.get("parity_safe") and cfg.keeps_k_order:
            rows[(r["m"], r["n"], r["k"])] = cfg
    return rows


def exact_config(m: int, n: int, k: int) -> DecodeConfig | None:
    """The decode-kernel config exact mode runs for an ``[m, k]`` FP8 activation times an
    ``[n, k]`` weight, or None (M above ``MAX_TABLE_ROWS``: the fixed-tile kernel).

    Exact mode's rows must be bitwise the same at every M. The fixed-tile kernel
    (``gemm_triton.EXACT_CONFIG``, 64-row wgmma tiles) and a ``keeps_k_order`` config of this
    kernel compute an output the same way: each 128-wide K block's wgmma product times
    ``sa·sb``, added in K order in float32 (``k_trip`` and ``scale_ahead`` keep that order).
    Checked bitwise on the H200 for the 8B/7B shapes at M = 1-256 against the fixed-tile
    kernel's rows at M = 4096 (``tests/fp8_kernels/test_exact_decode_gemm_gpu.py``). Alone (with
    ``EXACT_DEFAULT`` for every shape) it took the exact 8-layer decode at batch 64 from 24,014
    to 28,018 tok/s (2026-12-04, ``benchmarks/results/issue14-h200.md``).
    """
    if m > MAX_TABLE_ROWS:
        return None
    return _exact_table().get((m_bucket(m), n, k), EXACT_DEFAULT)


def set_enabled(on: bool) -> bool:
    """Let the fast path dispatch to every tuned row (split-K, the prologue, the untuned row
    range; process-wide); returns the previous setting.

    Off by default: those rows are not bitwise the trainer's ``scaled_mm`` FProp, so they raise
    the fast-mode rollout/trainer mismatch (module doc). With it off the default path still runs
    the measured parity-safe rows (``set_parity_safe``). Exact mode runs ``exact_config``.
    """
    previous, _ENABLED[0] = _ENABLED[0], bool(on)
    return previous


def set_parity_safe(on: bool) -> bool:
    """Let the default fast path run the table's parity-safe rows (on by default; process-wide);
    returns the previous setting. Off gives the path before them (benchmarks' baseline)."""
    previous, _PARITY_SAFE[0] = _PARITY_SAFE[0], bool(on)
    return previous


def prologue_wins(m: int, n: int, k: int) -> bool:
    """Whether the table measured the fused-prologue kernel faster than quantize + library GEMM
    at (M bucket, N, K); False for shapes it has no row for, and while not ``set_enabled``."""
    if not _ENABLED[0]:
        return False
    hit = _table().get((m_bucket(m), n, k))
    return hit is not None and hit[1].get("prologue", False)


def decode_wins(m: int, n: int, k: int) -> bool:
    """Whether ``fp8_gemm`` runs the decode kernel on an already-quantized activation.

    By default: only where the table has a parity-safe row for (M bucket, N, K) that won or
    where the library is not bitwise the trainer's rows
    (``_parity_safe_table``), so the rollout's rows stay bitwise the trainer's. After
    ``set_enabled(True)``: the speed-tuned row's measured ``fp8_in`` flag, else
    ``MIN_DECODE_ROWS ≤ m ≤ MAX_DECODE_ROWS``.
    """
    if not _ENABLED[0]:
        safe = _PARITY_SAFE[0] and (m_bucket(m), n, k) in _parity_safe_table()
        return safe and m <= MAX_TABLE_ROWS
    hit = _table().get((m_bucket(m), n, k))
    if hit is not None and "fp8_in" in hit[1]:
        return hit[1]["fp8_in"] and m <= MAX_TABLE_ROWS
    return MIN_DECODE_ROWS <= m <= MAX_DECODE_ROWS


def heuristic_config(m: int, n: int, k: int) -> DecodeConfig:
    """Untuned fallback: ``BLOCK_M`` covers M up to 64, split-K to reach ~2 programs per SM."""
    block_m = block_m_for(m)
    block_n = 64 if m <= 64 else 128
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    k_blocks = triton.cdiv(k, GROUP)
    split = 1
    while split < 8 and tiles * split * 2 <= 2 * _NUM_SMS and k_blocks // (split * 2) >= 4:
        split *= 2
    return DecodeConfig(block_m, block_n, split)


def decode_config(m: int, n: int, k: int) -> DecodeConfig:
    """The config for (M bucket, N, K): by default the winning parity-safe row where the table
    has one; else (and after ``set_enabled(True)``) the speed-tuned row, else
    ``heuristic_config``."""
    if not _ENABLED[0] and _PARITY_SAFE[0]:
        safe = _parity_safe_table().get((m_bucket(m), n, k))
        if safe is not None:
            return safe
    tuned = _table().get((m_bucket(m), n, k))
    return tuned[0] if tuned is not None else heuristic_config(m, n, k)


def config_row(
    m: int, n: int, k: int, cfg: DecodeConfig, *, prologue: bool, fp8_in: bool | None = None
) -> dict:
    """One table row (what ``benchmarks/gemm_tune.py`` writes)."""
    row = {"m": m_bucket(m), "n": n, "k": k, **asdict(cfg), "prologue": prologue}
    return row if fp8_in is None else {**row, "fp8_in": fp8_in}


@functools.cache
def _shared_memory_limit(device: torch.device) -> int | None:
    """Bytes of shared memory one program may use on ``device`` (None off CUDA)."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin


def fit_stages(cfg: DecodeConfig, a_bytes: int, limit: int | None) -> DecodeConfig:
    """``cfg`` with ``num_stages`` lowered (to 1 at the least) while its estimated pipelined
    tiles exceed ``limit`` bytes.

    Estimate per stage: ``k_trip`` K blocks of the activation (``block_m × 128 × a_bytes``; 1 for
    FP8 codes, 2 / 4 for a BF16 / FP32 input quantized in the prologue) and of the weight
    (``block_n × 128`` FP8 codes). For FP8 codes it equals what Triton allocated on the sm_90
    compiles checked (2026-12-04); for a BF16 input it is above it (e.g. 288 vs 232 KB at
    ``k_trip`` 4, 64×64 tiles, 3 stages). A table row is tuned on FP8 codes; the same row on a
    BF16 input can need more than the H200's 227 KB and would not launch (the GPU variant test
    hit this). The stage count changes only how far loads run ahead, never the sum: the result
    is bitwise the same. ``limit`` None (CPU, interpreter) keeps ``cfg``; a config that does
    not fit even at 1 stage is returned at 1 stage and fails at launch."""
    per_stage = cfg.k_trip * GROUP * (cfg.block_m * a_bytes + cfg.block_n)
    stages = cfg.num_stages
    while limit is not None and stages > 1 and stages * per_stage > limit:
        stages -= 1
    return cfg if stages == cfg.num_stages else replace(cfg, num_stages=stages)


def _locks(device: torch.device) -> Tensor:
    locks = _LOCKS.get(device)
    if locks is None:
        locks = _LOCKS[device] = torch.zeros(_LOCK_SLOTS, dtype=torch.int32, device=device)
    return locks


@triton.jit
def _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb, k_end, stride_sam, stride_sak, stride_sbk,
               A_FP8: tl.constexpr):  # fmt: skip
    """The activation scales ``[BLOCK_M]`` (zeros when quantized in the prologue) and the weight
    tile's scale ``[1]`` of K block ``kb``; zeros (nothing read) when ``kb ≥ k_end``, so a block past the
    split adds ``0 · 0`` (never ``0 · inf``) and an empty split reads no memory."""
    one = tl.arange(0, 1)
    sb = tl.load(sb_row + kb * stride_sbk + one, mask=one + kb < k_end, other=0.0)  # [1]
    if A_FP8:
        sa = tl.load(sa_ptr + offs_m * stride_sam + kb * stride_sak,
                     mask=mask_m & (offs_m * 0 + kb < k_end), other=0.0)  # fmt: skip
    else:
        sa = offs_m.to(tl.float32) * 0.0
    return sa, sb


@triton.jit
def _block_operands(a_ptrs, b_ptrs, kb, k_end, K, offs_k, mask_m, mask_n, sa_out_ptr, offs_m,
                    stride_so_m, stride_so_k, write_sa, sa, A_FP8: tl.constexpr,
                    POW2: tl.constexpr):  # fmt: skip
    """K block ``kb``'s activation codes ``[BLOCK_M, 128]`` and scales, weight codes
    ``[128, BLOCK_N]`` (zeros past ``k_end``). A BF16/FP32 activation is quantized here, bitwise
    ``per_token_group_quant``, and its scales written out by the first N tile."""
    k_mask = offs_k < tl.where(kb < k_end, K - kb * 128, 0)
    a = tl.load(a_ptrs, mask=mask_m[:, None] & k_mask[None, :], other=0.0)
    b = tl.load(b_ptrs, mask=k_mask[:, None] & mask_n[None, :], other=0.0)
    if A_FP8:
        a8 = a
    else:
        af = a.to(tl.float32)
        sa = _scale_from_amax(tl.max(_nan_to_inf_abs(af), axis=1), POW2)
        # rows past M: scale 1, not 2**-126 (suspected div.rn slow path; M=1 ran at half speed)
        sa = tl.where(mask_m, sa, 1.0)
        a8 = _to_codes(af, sa[:, None])
        in_range = offs_m * 0 + kb < k_end
        tl.store(sa_out_ptr + offs_m * stride_so_m + kb * stride_so_k, sa,
                 mask=write_sa & in_range)  # fmt: skip
    return a8, b, sa


@triton.jit(do_not_specialize=["M"])
def _decode_gemm_kernel(
    a_ptr, sa_ptr, b_ptr, sb_ptr, c_ptr, sa_out_ptr, ws_ptr, lock_ptr, M, N, K,
    stride_am, stride_sam, stride_sak, stride_bn, stride_sbn, stride_sbk, stride_cm,
    stride_so_m, stride_so_k,
    A_FP8: tl.constexpr, POW2: tl.constexpr, B_ROW_DIV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
    SCALE_AHEAD: tl.constexpr, K_TRIP: tl.constexpr,
):  # fmt: skip
    BLOCK_K: tl.constexpr = 128
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    k_blocks = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    kb_start = pid_k * per_split
    kb_end = tl.minimum(kb_start + per_split, k_blocks)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    a_ptrs = (
        a_ptr + offs_m.to(tl.int64)[:, None] * stride_am + (kb_start * BLOCK_K + offs_k)[None, :]
    )
    b_ptrs = (
        b_ptr + offs_n.to(tl.int64)[None, :] * stride_bn + (kb_start * BLOCK_K + offs_k)[:, None]
    )
    sb_row = sb_ptr + (pid_n * BLOCK_N // B_ROW_DIV) * stride_sbn
    write_sa = mask_m & ((offs_m * 0 + pid_n) == 0)  # the first N tile writes the scales

    # SCALE_AHEAD 1: the scales of the next trip are loaded one trip early, so no trip waits on
    # a global load for them. K_TRIP 2 / 4: a trip issues two / four independent K-block
    # products before adding them in K order (the same sum, more wgmma work in flight).
    sa_n0, sb_n0 = _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb_start, kb_end, stride_sam,
                              stride_sak, stride_sbk, A_FP8)  # fmt: skip
    sa_n1, sb_n1 = _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb_start + 1, kb_end,
                              stride_sam, stride_sak, stride_sbk, A_FP8)  # fmt: skip
    if K_TRIP == 4:
        sa_n2, sb_n2 = _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb_start + 2, kb_end,
                                  stride_sam, stride_sak, stride_sbk, A_FP8)  # fmt: skip
        sa_n3, sb_n3 = _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb_start + 3, kb_end,
                                  stride_sam, stride_sak, stride_sbk, A_FP8)  # fmt: skip
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb_start, kb_end, K_TRIP):
        if SCALE_AHEAD == 0:
            sa0, sb0 = _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb, kb_end, stride_sam,
                                  stride_sak, stride_sbk, A_FP8)  # fmt: skip
            sa1, sb1 = _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb + 1, kb_end,
                                  stride_sam, stride_sak, stride_sbk, A_FP8)  # fmt: skip
            if K_TRIP == 4:
                sa2, sb2 = _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb + 2, kb_end,
                                      stride_sam, stride_sak, stride_sbk, A_FP8)  # fmt: skip
                sa3, sb3 = _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb + 3, kb_end,
                                      stride_sam, stride_sak, stride_sbk, A_FP8)  # fmt: skip
        elif K_TRIP == 4:
            sa0, sb0, sa1, sb1 = sa_n0, sb_n0, sa_n1, sb_n1
            sa2, sb2, sa3, sb3 = sa_n2, sb_n2, sa_n3, sb_n3
            sa_n0, sb_n0 = _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb + 4, kb_end,
                                      stride_sam, stride_sak, stride_sbk, A_FP8)  # fmt: skip
            sa_n1, sb_n1 = _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb + 5, kb_end,
                                      stride_sam, stride_sak, stride_sbk, A_FP8)  # fmt: skip
            sa_n2, sb_n2 = _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb + 6, kb_end,
                                      stride_sam, stride_sak, stride_sbk, A_FP8)  # fmt: skip
            sa_n3, sb_n3 = _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb + 7, kb_end,
                                      stride_sam, stride_sak, stride_sbk, A_FP8)  # fmt: skip
        elif K_TRIP == 2:
            sa0, sb0, sa1, sb1 = sa_n0, sb_n0, sa_n1, sb_n1
            sa_n0, sb_n0 = _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb + 2, kb_end,
                                      stride_sam, stride_sak, stride_sbk, A_FP8)  # fmt: skip
            sa_n1, sb_n1 = _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb + 3, kb_end,
                                      stride_sam, stride_sak, stride_sbk, A_FP8)  # fmt: skip
        else:
            sa0, sb0 = sa_n0, sb_n0
            sa1, sb1 = sa_n1, sb_n1
            sa_n0, sb_n0 = _scales_at(sa_ptr, sb_row, offs_m, mask_m, kb + 1, kb_end,
                                      stride_sam, stride_sak, stride_sbk, A_FP8)  # fmt: skip
        a0, b0, sa0 = _block_operands(a_ptrs, b_ptrs, kb, kb_end, K, offs_k, mask_m, mask_n,
                                      sa_out_ptr, offs_m, stride_so_m, stride_so_k, write_sa,
                                      sa0, A_FP8, POW2)  # fmt: skip
        if K_TRIP == 4:  # four products in flight, added in K order
            a1, b1, sa1 = _block_operands(a_ptrs + BLOCK_K, b_ptrs + BLOCK_K, kb + 1, kb_end, K,
                                          offs_k, mask_m, mask_n, sa_out_ptr, offs_m,
                                          stride_so_m, stride_so_k, write_sa, sa1, A_FP8,
                                          POW2)  # fmt: skip
            a2, b2, sa2 = _block_operands(a_ptrs + 2 * BLOCK_K, b_ptrs + 2 * BLOCK_K, kb + 2,
                                          kb_end, K, offs_k, mask_m, mask_n, sa_out_ptr, offs_m,
                                          stride_so_m, stride_so_k, write_sa, sa2, A_FP8,
                                          POW2)  # fmt: skip
            a3, b3, sa3 = _block_operands(a_ptrs + 3 * BLOCK_K, b_ptrs + 3 * BLOCK_K, kb + 3,
                                          kb_end, K, offs_k, mask_m, mask_n, sa_out_ptr, offs_m,
                                          stride_so_m, stride_so_k, write_sa, sa3, A_FP8,
                                          POW2)  # fmt: skip
            p0 = tl.dot(a0, b0)
            p1 = tl.dot(a1, b1)
            p2 = tl.dot(a2, b2)
            p3 = tl.dot(a3, b3)  # blocks past kb_end: all zeros, add +0
            acc += p0 * (sa0 * sb0)[:, None]
            acc += p1 * (sa1 * sb1)[:, None]
            acc += p2 * (sa2 * sb2)[:, None]
            acc += p3 * (sa3 * sb3)[:, None]
        elif K_TRIP == 2:
            a1, b1, sa1 = _block_operands(a_ptrs + BLOCK_K, b_ptrs + BLOCK_K, kb + 1, kb_end, K,
                                          offs_k, mask_m, mask_n, sa_out_ptr, offs_m,
                                          stride_so_m, stride_so_k, write_sa, sa1, A_FP8,
                                          POW2)  # fmt: skip
            p0 = tl.dot(a0, b0)
            p1 = tl.dot(a1, b1)  # all zeros past kb_end: adds +0
            acc += p0 * (sa0 * sb0)[:, None]
            acc += p1 * (sa1 * sb1)[:, None]
        else:
            acc += tl.dot(a0, b0) * (sa0 * sb0)[:, None]
        a_ptrs += K_TRIP * BLOCK_K
        b_ptrs += K_TRIP * BLOCK_K

    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    c_mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
    else:
        tile_elems = M * N
        ws_tile = ws_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(ws_tile + pid_k * tile_elems, acc, mask=c_mask)
        tl.debug_barrier()
        lock = lock_ptr + pid_m * tl.num_programs(0) + pid_n
        arrived = tl.atomic_add(lock, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:  # the last split sums all partials, in split order
            tl.debug_barrier()
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT_K):
                total += tl.load(
                    ws_tile + s * tile_elems, mask=c_mask, other=0.0, cache_modifier=".cg"
                )
            tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=c_mask)
            tl.atomic_xchg(lock, 0)


def fp8_gemm_decode(
    x: Tensor | QuantizedTensor,
    weight: QuantizedTensor,
    *,
    out_dtype: torch.dtype,
    scale_format: str = "fp32",
    config: DecodeConfig | None = None,
) -> tuple[Tensor, Tensor]:
    """``x [M, K] · weight [N, K]ᵀ`` → ``([M, N] out_dtype, activation scales [M, ceil(K/128)])``.

    Args:
        x: BF16/FP32 activation (quantized 1×128 in the prologue with ``scale_format``) or a
            (1,128) ``QuantizedTensor``. M ≤ ``MAX_DECODE_ROWS`` is what it is tuned for.
        weight: 128×128-block ``QuantizedTensor`` with K-contiguous codes.
        config: override the table (benchmarks/tuning only).
    Returns the output and the activation's float32 scales (those of ``x`` when quantized).
    """
    assert weight.block == (GROUP, GROUP) and weight.codes.stride(-1) == 1
    quantized = isinstance(x, QuantizedTensor)
    a = x.codes if quantized else x
    if a.stride(-1) != 1:
        a = a.contiguous()
    m, k = a.shape
    n = weight.shape[0]
    device = a.device
    out = torch.empty(m, n, dtype=out_dtype, device=device)
    sa = (
        x.scale
        if quantized
        else torch.empty(m, triton.cdiv(k, GROUP), dtype=torch.float32, device=device)
    )
    cfg = config or decode_config(m, n, k)
    cfg = fit_stages(cfg, a.element_size(), _shared_memory_limit(device))
    if m == 0 or n == 0:
        return out, sa
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m), cfg.split_k)
    assert grid[0] * grid[1] <= _LOCK_SLOTS
    ws = (
        torch.empty(cfg.split_k, m, n, dtype=torch.float32, device=device)
        if cfg.split_k > 1
        else out
    )
    sa_in = sa if quantized else out  # unused pointer when quantizing in the prologue
    _decode_gemm_kernel[grid](
        a, sa_in, weight.codes, weight.scale, out, sa, ws, _locks(device), m, n, k,
        a.stride(0), sa_in.stride(0) if quantized else 0, sa_in.stride(1) if quantized else 0,
        weight.codes.stride(0), weight.scale.stride(0), weight.scale.stride(1), out.stride(0),
        sa.stride(0), sa.stride(1),
        A_FP8=quantized, POW2=scale_format == "pow2", B_ROW_DIV=weight.block[0],
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SPLIT_K=cfg.split_k,
        SCALE_AHEAD=cfg.scale_ahead, K_TRIP=cfg.k_trip, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out, sa
