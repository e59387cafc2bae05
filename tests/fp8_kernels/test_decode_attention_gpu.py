"""GPU tests (H200) of the split-KV decode attention: BF16 and FP8 caches against the float64
reference, GQA ratios, split counts, lengths read from the device under CUDA-graph replay, and
the decoder's dispatch."""

from __future__ import annotations

import pytest
import torch

from fp8rl.kernels import decode_attention as da
from fp8rl.kernels.invariant import attention, attention_mask
from fp8rl.kernels.kv import kv_dequantize, kv_quantize

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
CUDA = "cuda"
K_SCALE, V_SCALE = 0.01, 0.015


def _inputs(b, h, hkv, d, cap, *, fp8, lq=1, seed=0):
    g = torch.Generator(device=CUDA).manual_seed(seed)
    q = torch.randn(b, h, lq, d, device=CUDA, generator=g).bfloat16()
    k = torch.randn(b, hkv, cap, d, device=CUDA, generator=g).bfloat16()
    v = torch.randn(b, hkv, cap, d, device=CUDA, generator=g).bfloat16()
    k_len = torch.randint(lq, cap + 1, (b,), device=CUDA, generator=g)
    k_len[0] = cap  # one full row, one of length lq
    k_len[-1] = lq
    pos = k_len[:, None] - lq + torch.arange(lq, device=CUDA)[None]
    scales = {}
    if fp8:
        ks = torch.tensor(K_SCALE, device=CUDA)
        vs = torch.tensor(V_SCALE, device=CUDA)
        k, v = kv_quantize(k, ks), kv_quantize(v, vs)
        scales = {"k_scale": ks, "v_scale": vs}
    return q, k, v, pos, k_len, scales


def _sdpa_path(q, k, v, pos, k_len, scales):
    """What the fast path did before: dequantize the whole cache, mask, SDPA."""
    if scales:
        k = kv_dequantize(k, scales["k_scale"], q.dtype)
        v = kv_dequantize(v, scales["v_scale"], q.dtype)
    mask = attention_mask(pos, k_len, k.shape[2])
    return attention(q, k, v, mask, scale=q.shape[-1] ** -0.5, exact=False)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize(
    ("b", "h", "hkv", "d", "cap"),
    [
        (2, 32, 8, 128, 4224),
        (7, 32, 8, 128, 640),
        (64, 32, 8, 128, 640),
        (5, 16, 4, 64, 300),
        (3, 8, 8, 64, 129),
        (4, 2, 1, 64, 256),
        (2, 28, 4, 128, 1000),
    ],
)
def test_decode_attention_is_as_close_to_float64_as_sdpa(b, h, hkv, d, cap, fp8):
    q, k, v, pos, k_len, scales = _inputs(b, h, hkv, d, cap, fp8=fp8)
    with torch.no_grad():
        ref = da.decode_attention_reference(q, k, v, pos, k_len, scale=d**-0.5, **scales).float()
        out = da.decode_attention(q, k, v, pos, k_len, scale=d**-0.5, **scales).float()
        sdpa = _sdpa_path(q, k, v, pos, k_len, scales).float()
    err, sdpa_err = (out - ref).abs().max().item(), (sdpa - ref).abs().max().item()
    assert err <= max(2 * sdpa_err, 1e-2), (err, sdpa_err)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_every_split_count_gives_the_reference_and_reruns_are_bitwise(fp8):
    q, k, v, pos, k_len, scales = _inputs(6, 32, 8, 128, 1100, fp8=fp8, lq=2)
    ref = da.decode_attention_reference(q, k, v, pos, k_len, scale=0.1, **scales).float()
    tiles = [(s, da.BLOCK_N) for s in (1, 2, 3, 5, 18)] + ([(3, 128)] if fp8 else [])
    for splits, block_n in tiles:
        kw = {"scale": 0.1, "splits": splits, "block_n": block_n, **scales}
        out = da.decode_attention(q, k, v, pos, k_len, **kw)
        again = da.decode_attention(q, k, v, pos, k_len, **kw)
        assert torch.equal(out, again), splits
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2, msg=str(splits))


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_cache_positions_at_or_past_k_len_are_never_read(fp8):
    q, k, v, pos, k_len, scales = _inputs(5, 16, 4, 64, 500, fp8=fp8)
    k2, v2 = k.clone(), v.clone()
    for i, n in enumerate(k_len.tolist()):  # NaN in both formats (E4M3 0x7f is NaN)
        k2.view(torch.uint8)[i, :, n:] = 0x7F if fp8 else 0xFF
        v2.view(torch.uint8)[i, :, n:] = 0x7F if fp8 else 0xFF
    a = da.decode_attention(q, k, v, pos, k_len, scale=0.125, **scales)
    b = da.decode_attention(q, k2, v2, pos, k_len, scale=0.125, **scales)
    assert torch.equal(a, b)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_graph_replay_reads_the_current_lengths(fp8):
    b, cap = 8, 768
    q, k, v, pos, k_len, scales = _inputs(b, 32, 8, 128, cap, fp8=fp8)
    static_q, static_pos, static_len = q.clone(), pos.clone(), k_len.clone()

    def step():
        return da.decode_attention(
            static_q, k, v, static_pos, static_len, scale=0.088, **scales
        )  # fmt: skip

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for seed in range(3):
        g = torch.Generator(device=CUDA).manual_seed(100 + seed)
        new_len = torch.randint(1, cap + 1, (b,), device=CUDA, generator=g)
        static_len.copy_(new_len)
        static_pos.copy_(new_len[:, None] - 1)
        static_q.copy_(torch.randn(q.shape, device=CUDA, generator=g).bfloat16())
        graph.replay()
        eager = da.decode_attention(static_q, k, v, static_pos, static_len, scale=0.088, **scales)
        assert torch.equal(out, eager), seed
        ref = da.decode_attention_reference(
            static_q, k, v, static_pos, static_len, scale=0.088, **scales
        )
        torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kv_fp8", [False, True], ids=["bf16-kv", "fp8-kv"])
def test_decoder_decode_step_with_the_kernel_is_close_to_the_sdpa_step(kv_fp8, monkeypatch):
    from dataclasses import replace

    from fp8rl.protocol import QuantConfig
    from fp8rl.workers.model import decoder
    from fp8rl.workers.model.build import build_decoder
    from fp8rl.workers.model.config import PRESETS
    from fp8rl.workers.model.decoder import KVCache
    from fp8rl.workers.model.linear import LayerPrecision

    cfg = replace(PRESETS["small-llama"], num_hidden_layers=2)
    precision = LayerPrecision(fp8=True, quant=QuantConfig(), trainable=False, kv_fp8=kv_fp8)
    model = build_decoder(
        cfg, precision, state_dict=None, max_positions=256, param_dtype=torch.bfloat16, device=CUDA
    )
    if kv_fp8:
        for layer in model.model.layers:
            layer.self_attn.k_scale.fill_(0.05)
            layer.self_attn.v_scale.fill_(0.05)
    b, width = 6, 40
    ids = torch.randint(0, cfg.vocab_size, (b, width), device=CUDA)
    lens = torch.tensor([40, 3, 17, 40, 1, 29], device=CUDA)
    nxt = torch.randint(0, cfg.vocab_size, (b, 1), device=CUDA)
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return da.decode_attention(*args, **kwargs)

    monkeypatch.setattr(decoder, "decode_attention", spy)
    outs, counts = [], []
    with torch.inference_mode():
        for on in (True, False):
            previous = da.set_enabled(on)
            cache = KVCache.allocate(
                cfg, batch=b, capacity=200, dtype=torch.bfloat16, device=CUDA, kv_fp8=kv_fp8
            )
            model(ids, torch.arange(width, device=CUDA).expand(b, width), lens, cache)
            outs.append(model(nxt, lens[:, None], lens + 1, cache, kv_limit=128).float())
            counts.append(len(calls))
            da.set_enabled(previous)
    kernel, sdpa = outs
    rel = ((kernel - sdpa).norm() / sdpa.norm()).item()
    assert counts == [2, 2], counts  # the decode step of each layer, not the prefill; not when off
    assert rel < 2e-2, rel
