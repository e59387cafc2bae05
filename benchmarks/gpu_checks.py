"""GPU checks that need a device but no Ray: engine↔trainer parity per mode, CUDA IPC weight sync.

    python benchmarks/gpu_checks.py --out DIR

1. Parity (DESIGN.md §6 metrics) on random models for bf16 / fp8_rollout / unified_fp8 with
   exact on and off: the engine samples, the trainer-precision forward scores the same ids.
2. CUDA IPC: a trainer-side FP8 update sent as IPC handles to another process on the same GPU;
   the receiver's wsum64 checksums must equal the manifest's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from fp8rl.protocol import ModelSpec, PrecisionSpec, QuantConfig, SamplingParams
from fp8rl.services.mismatch import MODES, measure_mode
from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.model.loading import ModelSource
from fp8rl.workers.weight_sync.checksum import wsum64
from fp8rl.workers.weight_sync.cuda_ipc import CudaIpcTransport
from fp8rl.workers.weight_sync.update import build_update


def parity(preset: str, prompts: int, n: int, max_tokens: int) -> list[dict]:
    cfg = PRESETS[preset]
    source = ModelSource(cfg, None, None, f"random:{preset}")
    spec = ModelSpec(path=f"random:{preset}", max_model_len=512)
    gen = torch.Generator().manual_seed(0)
    ids = [
        torch.randint(
            3, cfg.vocab_size, (int(torch.randint(8, 48, (1,), generator=gen)),), generator=gen
        ).tolist()
        for _ in range(prompts)
    ]
    rows = []
    for exact in (True, False):
        for mode in MODES:
            t0 = time.perf_counter()
            report = measure_mode(
                source,
                spec,
                PrecisionSpec(mode=mode, exact=exact),
                ids,
                SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, seed=0),
                device=torch.device("cuda"),
                batch_size=prompts * n,
            )
            rows.append(
                {
                    "preset": preset,
                    "mode": mode,
                    "exact": exact,
                    "tokens": report.num_tokens,
                    **{k.split("/")[1]: v for k, v in report.metrics.items()},
                    "seconds": time.perf_counter() - t0,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _receive(handles, queue):
    transport = CudaIpcTransport()
    got = transport.receive(None, handles, torch.device("cuda"))
    queue.put({k: wsum64(v) for k, v in got.items()})


def cuda_ipc() -> dict:
    cfg = PRESETS["tiny-llama"]
    trainer = build_decoder(
        cfg,
        LayerPrecision(fp8=True, quant=QuantConfig(), trainable=True),
        state_dict=None,
        max_positions=64,
        param_dtype=torch.float32,
        device="cuda",
    )
    receiver = LayerPrecision(fp8=True, quant=QuantConfig(), trainable=False)
    update, payload = build_update(
        trainer, receiver=receiver, version=1, fingerprint="x", transport="cuda_ipc"
    )
    transport = CudaIpcTransport()
    handles = transport.send(payload)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_receive, args=(handles, queue))
    proc.start()
    sums = queue.get(timeout=120)
    proc.join(timeout=60)
    expected = {e.name: e.checksum for e in update.tensors}
    bad = [k for k in expected if sums.get(k) != expected[k]]
    return {"tensors": len(expected), "checksum_mismatches": len(bad), "ok": not bad}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "parity": []}
    try:
        results["cuda_ipc"] = cuda_ipc()
    except Exception as exc:  # report and go on to parity
        results["cuda_ipc"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(results["cuda_ipc"]), flush=True)
    for preset, tokens in (("tiny-llama", 128), ("small-llama", 256)):
        try:
            results["parity"] += parity(preset, 16, 2, tokens)
        except Exception as exc:
            results.setdefault("errors", []).append(f"{preset}: {type(exc).__name__}: {exc}")
            print(results["errors"][-1], flush=True)
    lines = [
        "| model | mode | exact | tokens | token_mult_prob_error | kl_k3 | max abs dlogp | mean abs dlogp |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["parity"]:
        lines.append(
            f"| {r['preset']} | {r['mode']} | {r['exact']} | {r['tokens']} | "
            f"{r['token_mult_prob_error']:.8f} | {r['kl_k3']:.2e} | {r['abs_dlogp_max']:.3e} | "
            f"{r['abs_dlogp_mean']:.3e} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_checks.json").write_text(json.dumps(results, indent=2))
        (args.out / "gpu_parity.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
