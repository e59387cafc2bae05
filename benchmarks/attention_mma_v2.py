"""Can the trainer and a decode call both run mma.sync tiles, so that decode reads its KV cache
with 16-row tiles (4 real rows of 16, not of 64) and still gives the trainer's bits? (issue 14)

    cd benchmarks && python attention_mma_v2.py [--quick]

The invariant attention (``attention_exact_triton._fwd_kernel``) runs 64-row tiles on 4 warps,
which Triton compiles to wgmma (MMAv3). A decode step has G = 4 query rows per KV head, so 60 of
the 64 rows are padding: 15/16 of the MMA and softmax work of every trip is wasted, and over an
FP8 cache the dequantized K and V tiles must be stored to shared memory for wgmma's B operand.
The 16-row decode tiles tried on 2026-12-04 (mma.sync, 4 warps) were not bitwise the trainer's
wgmma rows on model activations. Triton picks wgmma only for a multiple of 4 warps over 64-row
tiles; with fewer warps or 32-row tiles the same kernel compiles to mma.sync, and a row's bits then
depend on the MMA instruction and on how the row's columns are spread over threads and warps.
Two pairings keep both the same on the two sides (Triton's MMAv2 ``warpsPerTile``):

* A: trainer 64 rows / 2 warps (score tile split [2, 1]: each warp owns whole rows) and decode
  16 rows / 1 warp;
* B: trainer 32 rows / 4 warps (score tile [2, 2]: a row's 64 keys over 2 warps) and decode
  16 rows / 2 warps ([1, 2]).

C is the control: the committed trainer (64 rows / 4 warps, wgmma) against 16 rows / 4 warps, known
to differ on heavy-tailed inputs. Checks every decode position against the trainer's full-sequence
row on heavy-tailed inputs (Student-t, outlier channels), BF16 and FP8 caches (the trainer reads
``kv_round_trip`` keys), then times decode calls (CUDA graph, µs) and the trainer forward at
4 × 4,096 causal. Nothing here changes the committed kernel.

Result (H100, Triton 3.6, 2026-12-05, ``results/issue14/mma-v2-1205``): B and E are bitwise over
BF16 caches (A and C are not), but a BF16 decode call is no faster on them (64 × 2,176 keys:
192 µs on every tile but 16 / 1) and the trainer forward doubles (1.6 → 3.2-3.5 ms). Over an
FP8 cache 16 / 2 is 6-11 % faster, but no pairing is bitwise there, not even E: an mma.sync tile
that dequantizes the cache in registers does not give the rows of the same tile over the
round-tripped BF16 keys (the committed 64-row wgmma tile does: ``fp8_kv_bitwise_probe.py``).
The pairing was not adopted.
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import triton
from decode_attention import graph_time_us  # this folder (run as a script)

from fp8rl.kernels import attention_exact_triton as att
from fp8rl.kernels.kv import kv_quantize, kv_round_trip, kv_scale_from_amax

H, HKV, D = 32, 8, 128
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: TRITON_INTERPRET=1, logic only
DT = (
    torch.bfloat16 if DEV == "cuda" else torch.float16
)  # the interpreter rounds to BF16 its own way
G = H // HKV
SCALE = D**-0.5
PAIRS = {  # name: ((trainer rows, warps), (decode rows, warps))
    "A": ((64, 2), (16, 1)),
    "B": ((32, 4), (16, 2)),
    "C (control)": ((64, 4), (16, 4)),
    "E": ((32, 4), (32, 4)),  # the trainer's tiles for decode too: bitwise by construction
}


def launch(q, k, v, nvis, tiles, stages, ks=None, vs=None, late_v=True, maxnreg=None):
    """The committed forward kernel at ``tiles`` = (rows, warps); returns the output."""
    bm, warps = tiles
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g, fp8 = h // hkv, k.dtype == torch.float8_e4m3fn
    out = torch.empty_like(q)
    lse = torch.empty(b, h, lq, dtype=torch.float32, device=q.device)
    cap = {"maxnreg": maxnreg} if maxnreg else {}
    att._fwd_kernel[(triton.cdiv(g * lq, bm), b * hkv)](
        q, k, v, ks if fp8 else q, vs if fp8 else q, out, lse, nvis, lq, lk, g * lq, g, hkv,
        SCALE * 1.4426950408889634,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        D=d, BM=bm, BN=att.BLOCK_N, KV_FP8=fp8, LATE_V=fp8 and late_v,
        num_warps=warps, num_stages=stages, **cap,
    )  # fmt: skip
    return out


def heavy(shape, gen, df=4.0):
    """Student-t values with a few 4x outlier channels (like model activations), BF16."""
    t = torch.distributions.StudentT(df).sample(shape).to(DEV)
    channels = 1 + 3 * (torch.rand(shape[-1], generator=gen) > 0.95).float().to(DEV)
    return (t * channels).clamp(-30, 30).to(DT)


def bitwise_rows(
    pair, kv, seed, length=520, batch=3, positions=(0, 1, 63, 64, 65, 127, 128, 300, 511, 519)
):
    """Positions whose decode row differs from the trainer's row, out of those checked."""
    (train_tiles, decode_tiles) = PAIRS[pair]
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    q = heavy((batch, H, length, D), gen)
    k = heavy((batch, HKV, length, D), gen)
    v = heavy((batch, HKV, length, D), gen)
    ks = vs = None
    if kv == "fp8":
        ks, vs = kv_scale_from_amax(k.abs().amax()), kv_scale_from_amax(v.abs().amax())
        kt, vt = kv_round_trip(k, ks, DT), kv_round_trip(v, vs, DT)
    else:
        kt, vt = k, v
    full_nvis = torch.arange(1, length + 1, device=DEV, dtype=torch.int32).expand(batch, length)
    full = launch(q, kt, vt, full_nvis.contiguous(), train_tiles, att.NUM_STAGES)
    cap = length + 120
    kc = torch.zeros(
        batch, HKV, cap, D, device=DEV, dtype=k.dtype if kv == "bf16" else torch.float8_e4m3fn
    )
    vc = torch.zeros_like(kc)
    if kv == "fp8":
        kc[:, :, :length], vc[:, :, :length] = kv_quantize(k, ks), kv_quantize(v, vs)
    else:
        kc[:, :, :length], vc[:, :, :length] = k, v
    differ = []
    for p in positions:
        nvis = torch.full((batch, 1), p + 1, device=DEV, dtype=torch.int32)
        out = launch(q[:, :, p : p + 1].contiguous(), kc, vc, nvis, decode_tiles, 3, ks, vs)
        if not torch.equal(out, full[:, :, p : p + 1]):
            differ.append(p)
    return differ, len(positions)


def time_decode(batch, keys, kv, tiles, stages, late_v=True, maxnreg=None):
    cap = -(-keys // 128) * 128
    q = torch.randn(batch, H, 1, D, device=DEV).bfloat16()
    k = torch.randn(batch, HKV, cap, D, device=DEV).bfloat16()
    v = torch.randn(batch, HKV, cap, D, device=DEV).bfloat16()
    nvis = torch.full((batch, 1), keys, device=DEV, dtype=torch.int32)
    ks = vs = None
    if kv == "fp8":
        ks, vs = torch.tensor(0.0123, device=DEV), torch.tensor(0.0087, device=DEV)
        k, v = kv_quantize(k, ks), kv_quantize(v, vs)
    fn = partial(launch, q, k, v, nvis, tiles, stages, ks, vs, late_v, maxnreg)
    return graph_time_us(fn), batch * HKV * keys * D * 2 * k.element_size()


def time_trainer(tiles, stages, batch=4, length=4096):
    q = torch.randn(batch, H, length, D, device=DEV).bfloat16()
    k = torch.randn(batch, HKV, length, D, device=DEV).bfloat16()
    v = torch.randn(batch, HKV, length, D, device=DEV).bfloat16()
    nvis = torch.arange(1, length + 1, device=DEV, dtype=torch.int32).expand(batch, length)
    return graph_time_us(partial(launch, q, k, v, nvis.contiguous(), tiles, stages))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one seed, fewer shapes")
    args = parser.parse_args()
    gpu = torch.cuda.get_device_name()
    hbm = 3.35e12 if "H100" in gpu else 4.3e12
    print(f"{gpu}, Triton {triton.__version__}")
    lines = [
        "| pair | cache | seed | decode positions differing from the trainer's rows |",
        "|---|---|---|---|",
    ]
    for pair in PAIRS:
        for kv in ("bf16", "fp8"):
            for seed in (0,) if args.quick else (0, 1):
                try:
                    differ, n = bitwise_rows(pair, kv, seed)
                    lines.append(f"| {pair} | {kv} | {seed} | {len(differ)} of {n} {differ} |")
                except Exception as exc:  # keep the other rows
                    lines.append(
                        f"| {pair} | {kv} | {seed} | error {type(exc).__name__}: {str(exc)[:90]} |"
                    )
                print(lines[-1], flush=True)
    timing = [
        "| call | cache | tiles (rows, warps) | stages | µs | % HBM |",
        "|---|---|---|---|---|---|",
    ]
    shapes = [(64, 2176), (64, 4160)] + ([] if args.quick else [(256, 2176)])
    for batch, keys in shapes:
        for kv in ("bf16", "fp8"):
            committed = [((64, 4), 3, True, att.FP8_KV_MAXNREG if kv == "fp8" else None)]
            variants = committed + [
                (tiles, s, True, None)
                for tiles, s in (
                    ((32, 4), 2),
                    ((32, 4), 3),
                    ((16, 2), 2),
                    ((16, 2), 3),
                    ((16, 1), 3),
                )
            ]
            for tiles, stages, late_v, maxnreg in variants:
                try:
                    t, read = time_decode(batch, keys, kv, tiles, stages, late_v, maxnreg)
                    row = f"{t:.1f} | {100 * read / (t * 1e-6) / hbm:.0f}%"
                except Exception as exc:
                    row = f"error {type(exc).__name__} | {str(exc)[:60]}"
                name = f"decode {batch}×{keys}"
                tag = " (committed)" if (tiles, stages) == ((64, 4), 3) else ""
                timing.append(f"| {name} | {kv} | {tiles}{tag} | {stages} | {row} |")
                print(timing[-1], flush=True)
    for tiles, stages in (((64, 4), 2), ((32, 4), 2), ((32, 4), 3), ((64, 2), 2)):
        try:
            row = f"{time_trainer(tiles, stages):.1f} | "
        except Exception as exc:
            row = f"error {type(exc).__name__} | {str(exc)[:60]}"
        tag = " (committed)" if (tiles, stages) == ((64, 4), 2) else ""
        timing.append(f"| trainer fwd 4×4096 causal | bf16 | {tiles}{tag} | {stages} | {row} |")
        print(timing[-1], flush=True)
    print("\n".join([*lines, "", *timing]))


if __name__ == "__main__":
    main()
