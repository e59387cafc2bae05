"""Rollout throughput of the native engine: BF16 vs unified FP8, against the HBM roofline.

    python benchmarks/rollout.py --preset llama-3.1-8b --batch 64 256 --gen 1024 --prompt 128

Random weights (speed only). Prefill throughput = prompt tokens / time of one batched prefill.
Decode throughput = generated tokens / decode time (EOS disabled so every row runs ``--gen``
steps) of the second ``generate`` call of the same shape: the steady state of an RL loop, whose
engine keeps its CUDA graphs between calls (the first call's rate, with compilation and graph
captures, is printed beside it and kept in the JSON as ``first_call_decode_tok_s``). The decode
time is clocked around the engine's decode loop inside that call (``DecodeClock``); until
2026-12-05 it was the call's time minus one separately timed prefill, which a cold prefill
measurement (Triton compiling during it) made too large: an 8-layer exact-mode run reported
83,306 tok/s, 109 % of its roofline, where the loop ran at ~32,700. The roofline for a decode step is (bytes of weights read + bytes of KV cache read) /
HBM bandwidth: weights once per step (FP8 linears 1 byte/param + scales, BF16 lm_head),
KV for the average context length of the run. The bandwidth is the device's, measured at the
start of the run (``hbm_bytes_per_s``: a 1 GiB device copy, the brief's method for the H200's
4.3 TB/s); until 2026-12-05 it was the H200's 4.3 TB/s on every card, so H100 rows of earlier
runs read ~30 % low (the H100 copies at ~3.0 TB/s). "roofline vs BF16" is the ratio of the two rooflines:
the FP8/BF16 speedup if both modes ran at the same % of theirs (with a BF16 KV cache the KV bytes
are the same in both, so it falls as batch and context grow). Prints a table; ``--out`` writes
JSON + Markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from pathlib import Path

import torch

from fp8rl.kernels.invariant import FAST_ATTENTION_KERNELS, set_fast_attention
from fp8rl.protocol import QuantConfig, SamplingParams
from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.config import PRESETS, DecoderConfig
from fp8rl.workers.model.decoder import KVCache
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.rollout.engine import NativeEngine

HBM_BYTES_PER_S = 4.3e12
"""The H200's measured HBM copy rate (bytes/s): the roofline off CUDA, where none is measured."""


def hbm_bytes_per_s(device: str) -> float:
    """The device's HBM rate in bytes/s: bytes read + written by a 1 GiB device-to-device copy
    over its time (median of ``triton.testing.do_bench``); ``HBM_BYTES_PER_S`` off CUDA."""
    if not device.startswith("cuda"):
        return HBM_BYTES_PER_S
    from triton.testing import do_bench

    src = torch.empty(2**29, dtype=torch.bfloat16, device=device)  # 1 GiB
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=200)
    return 2 * 2**30 / (ms * 1e-3)


def linear_params(cfg: DecoderConfig) -> int:
    """Parameters of the decoder layers' linears (q, k, v, o, gate, up, down), all layers."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    per_layer = h * d * (cfg.num_attention_heads * 2 + cfg.num_key_value_heads * 2) + 3 * h * i
    return per_layer * cfg.num_hidden_layers


def linear_bytes(cfg: DecoderConfig, mode: str) -> float:
    """Bytes of the layers' linear weights: BF16 2/param, FP8 1/param + a FP32 scale per 128×128."""
    if mode == "bf16":
        return linear_params(cfg) * 2
    return linear_params(cfg) * (1 + 4 / (128 * 128))


def weight_bytes(cfg: DecoderConfig, mode: str) -> float:
    """Bytes of weights one decode step reads: the linears and the BF16 lm_head (embedding rows
    are negligible)."""
    return linear_bytes(cfg, mode) + cfg.vocab_size * cfg.hidden_size * 2


def kv_bytes_per_token(cfg: DecoderConfig, kv_fp8: bool) -> float:
    """K and V bytes per cached token, all layers."""
    return 2 * cfg.num_key_value_heads * cfg.head_dim * (1 if kv_fp8 else 2) * cfg.num_hidden_layers


def build(
    cfg: DecoderConfig, mode: str, max_positions: int, device: str, *, kv_fp8: bool, exact: bool
):
    precision = LayerPrecision(
        dtype=torch.bfloat16,
        fp8=mode != "bf16",
        quant=QuantConfig() if mode != "bf16" else None,
        exact=exact,
        trainable=False,
        kv_fp8=kv_fp8,
    )
    model = build_decoder(
        cfg,
        precision,
        state_dict=None,
        max_positions=max_positions,
        param_dtype=torch.bfloat16,
        device=device,
    )
    if kv_fp8:  # speed only: any calibrated scale will do (random weights)
        for layer in model.model.layers:
            layer.self_attn.k_scale.fill_(0.05)
            layer.self_attn.v_scale.fill_(0.05)
    return model


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.inference_mode()
def prefill_tokens_per_s(model, cfg, batch: int, prompt: int, device: str) -> float:
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device=device)
    pos = torch.arange(prompt, device=device).expand(batch, prompt)
    lens = torch.full((batch,), prompt, device=device)
    cache = KVCache.allocate(
        cfg,
        batch=batch,
        capacity=prompt,
        dtype=torch.bfloat16,
        device=device,
        kv_fp8=model.precision.kv_fp8,
    )
    model(ids, pos, lens, cache)  # warm-up
    sync(device)
    t0 = time.perf_counter()
    hidden = model(ids, pos, lens, cache)
    model.logits(hidden[:, -1])
    sync(device)
    return batch * prompt / (time.perf_counter() - t0)


class DecodeClock:
    """Seconds spent in a ``NativeEngine``'s decode loop (graph replays or eager steps, the
    token draws and host syncs included; prefill, cache setup and graph capture excluded).

    Wraps the engine's two decode-loop methods on this instance only; ``seconds`` is the sum
    over the chunks of the calls made since the last ``reset``.
    """

    def __init__(self, engine: NativeEngine, device: str):
        self.seconds, self.device = 0.0, device
        for name in ("_decode_graphs", "_decode_eager"):
            setattr(engine, name, self._timed(getattr(engine, name)))

    def _timed(self, loop):
        def run(*args, **kwargs):
            sync(self.device)
            t0 = time.perf_counter()
            loop(*args, **kwargs)
            sync(self.device)
            self.seconds += time.perf_counter() - t0

        return run

    def reset(self) -> None:
        self.seconds = 0.0


def decode_tokens_per_s(
    model, cfg, batch: int, prompt: int, gen: int, device: str, graphs: bool
) -> tuple[float, float]:
    """Decode tokens/s of the second and of the first ``generate`` call of one shape.

    The second call's rate is its tokens over its decode loop's seconds (``DecodeClock``). The
    first call's counts everything but that call's prefill and setup, taken to be the second
    call's (its wall time minus its decode loop): compilation and graph captures included.
    """
    engine = NativeEngine(model, eos_token_ids=[], max_batch_size=batch, cuda_graphs=graphs)
    clock = DecodeClock(engine, device)
    prompts = torch.randint(0, cfg.vocab_size, (batch, prompt)).tolist()
    sampling = SamplingParams(n=1, max_tokens=gen, temperature=1.0, seed=0)
    totals, loops = [], []
    # two calls of the timed shape: the first compiles this M bucket's kernels and captures the
    # graphs the engine keeps (what an RL loop's first rollout pays), the second is the steady
    # state every later rollout of that shape sees
    for _ in range(2):
        clock.reset()
        sync(device)
        t0 = time.perf_counter()
        out = engine.generate(prompts, sampling)
        sync(device)
        totals.append(time.perf_counter() - t0)
        loops.append(clock.seconds)
        assert all(len(g[0].token_ids) == gen for g in out)
    setup = totals[1] - loops[1]
    return batch * gen / loops[1], batch * gen / (totals[0] - setup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="llama-3.1-8b", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--gen", type=int, default=1024)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--modes", nargs="+", default=["bf16", "unified_fp8"])
    parser.add_argument(
        "--graphs", nargs="+", default=["on", "off"], help="CUDA graphs on and/or off"
    )
    parser.add_argument("--layers", type=int, help="override num_hidden_layers (e.g. 8)")
    parser.add_argument("--kv", nargs="+", default=["bf16"], choices=["bf16", "fp8"])
    parser.add_argument("--exact", action="store_true", help="precision.exact (bitwise mode)")
    parser.add_argument(
        "--decode-gemm",
        nargs="?",
        const="all",
        default="parity-safe",
        choices=["parity-safe", "off", "all"],
        help="decode GEMM dispatch: the measured parity-safe rows (default), none (the library "
        "path before them), or every tuned row incl. split-K (bare flag; breaks fast-mode "
        "parity, see kernels/gemm_decode_triton.py)",
    )
    parser.add_argument(
        "--decode-attn",
        nargs="+",
        default=["off"],
        choices=["on", "off"],
        help="split-KV decode attention kernel on and/or off (off, the default: the attention "
        "--attention picks; on breaks fast-mode parity, see kernels/decode_attention.py)",
    )
    parser.add_argument(
        "--rope-kv",
        nargs="+",
        default=["on"],
        choices=["on", "off"],
        help="fused RoPE + KV-cache write kernel on (default) and/or off (torch ops; bitwise "
        "the same results, see kernels/rope_kv.py)",
    )
    parser.add_argument(
        "--attention",
        default="triton",
        choices=FAST_ATTENTION_KERNELS,
        help="fast mode's attention on CUDA (kernels.invariant.set_fast_attention): the "
        "invariant Triton kernel (default; the engine reads the KV cache in place), the same "
        "with 16-row decode tiles (not bitwise the trainer; exact mode never runs them), or SDPA",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tag", help="file name stem under --out (default rollout)")
    args = parser.parse_args()
    set_fast_attention(args.attention)
    from fp8rl.kernels import decode_attention, gemm_decode_triton, rope_kv

    gemm_decode_triton.set_enabled(args.decode_gemm == "all")
    gemm_decode_triton.set_parity_safe(args.decode_gemm != "off")
    hbm = hbm_bytes_per_s(args.device)
    cfg = PRESETS[args.preset]
    if args.layers:
        cfg = dataclasses.replace(cfg, num_hidden_layers=args.layers)
    rows = []
    runs = [(m, kv) for m in args.modes for kv in args.kv if not (m == "bf16" and kv == "fp8")]
    for mode, kv in runs:
        kv_fp8 = kv == "fp8"
        model = build(
            cfg, mode, args.prompt + args.gen + 8, args.device, kv_fp8=kv_fp8, exact=args.exact
        )
        for batch in args.batch:
            prefill = prefill_tokens_per_s(model, cfg, batch, args.prompt, args.device)
            ctx = args.prompt + args.gen / 2
            step_bytes = weight_bytes(cfg, mode) + batch * ctx * kv_bytes_per_token(cfg, kv_fp8)
            roofline = batch / (step_bytes / hbm)
            variants = [
                (g, a, r) for g in args.graphs for a in args.decode_attn for r in args.rope_kv
            ]
            for graphs, attn, rope in variants:
                if graphs == "on" and not args.device.startswith("cuda"):
                    continue
                decode_attention.set_enabled(attn == "on")
                rope_kv.set_fused(rope == "on")
                try:
                    rate, first = decode_tokens_per_s(
                        model,
                        cfg,
                        batch,
                        args.prompt,
                        args.gen,
                        args.device,
                        graphs == "on",
                    )
                    error = ""
                except Exception as exc:  # keep the other rows of the table
                    rate = first = float("nan")
                    error = f"{type(exc).__name__}: {exc}"[:200]
                rows.append(
                    {
                        "mode": mode,
                        "kv": kv,
                        "exact": args.exact,
                        "decode_gemm": args.decode_gemm,
                        "decode_attn": attn,
                        "attention": args.attention,
                        "rope_kv": rope,
                        "gen": args.gen,
                        "layers": cfg.num_hidden_layers,
                        "batch": batch,
                        "cuda_graphs": graphs,
                        "prefill_tok_s": prefill,
                        "decode_tok_s": rate,
                        "first_call_decode_tok_s": first,
                        "hbm_tbps": hbm / 1e12,
                        "roofline_tok_s": roofline,
                        "roofline_pct": 100 * rate / roofline,
                        "error": error,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
                print(  # survives a stage's time limit (the table prints at the end)
                    f"row {mode} kv={kv} batch={batch} graphs={graphs} attn={attn} rope={rope}: "
                    f"{rate:,.0f} tok/s ({100 * rate / roofline:.0f}% roofline; first call "
                    f"{first:,.0f}) {error}",
                    flush=True,
                )
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    for row in rows:
        base = next(
            (
                r
                for r in rows
                if r["mode"] == "bf16"
                and r["kv"] == "bf16"
                and r["batch"] == row["batch"]
                and r["cuda_graphs"] == row["cuda_graphs"]
                and r["decode_attn"] == row["decode_attn"]
                and r["rope_kv"] == row["rope_kv"]
            ),
            None,
        )
        row["speedup_vs_bf16"] = (
            row["decode_tok_s"] / base["decode_tok_s"] if base else float("nan")
        )
        # The speedup if both ran at the same % of their rooflines: the bytes ratio of a step.
        row["roofline_vs_bf16"] = (
            row["roofline_tok_s"] / base["roofline_tok_s"] if base else float("nan")
        )
    header = (
        f"# Rollout throughput — {args.preset} ({cfg.num_hidden_layers} layers, random weights), "
        f"prompt {args.prompt}, gen {args.gen}{', exact' if args.exact else ''}"
        f", decode GEMM {args.decode_gemm}, fast attention {args.attention}\n\n"
        f"{time.strftime('%Y-%m-%d')} · {torch.cuda.get_device_name() if args.device.startswith('cuda') else platform.processor()}"
        f" · torch {torch.__version__} · roofline at {hbm / 1e12:.2f} TB/s (measured copy)\n\n"
        "| mode | KV | batch | CUDA graphs | decode attn | RoPE+KV fused | prefill tok/s | decode tok/s | vs BF16 | roofline tok/s | % roofline | roofline vs BF16 |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['mode']} | {r['kv']} | {r['batch']} | {r['cuda_graphs']} | {r['decode_attn']} | {r['rope_kv']} | {r['prefill_tok_s']:,.0f} | {r['decode_tok_s']:,.0f} | "
        f"{r['speedup_vs_bf16']:.2f}× | {r['roofline_tok_s']:,.0f} | {r['roofline_pct']:.0f}% | "
        f"{r['roofline_vs_bf16']:.2f}× |"
        for r in rows
    ]
    table = header + "\n".join(lines) + "\n"
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        tag = args.tag or "rollout"
        (args.out / f"{tag}.json").write_text(json.dumps(rows, indent=2))
        (args.out / f"{tag}.md").write_text(table)


if __name__ == "__main__":
    main()
