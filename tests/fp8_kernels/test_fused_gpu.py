"""GPU tests (H200) of the issue-14 kernels: fused norm/SwiGLU quant, the decode-size GEMM, the
fused inference decoder; exact mode untouched."""

from __future__ import annotations

import pytest
import torch

from fp8rl.kernels import (
    FP8Linear,
    fp8_gemm,
    fp8_gemm_reference,
    fp8_linear,
    per_block_quant,
    per_token_group_quant,
)
from fp8rl.kernels.fused import (
    add_rms_norm_quant,
    add_rms_norm_quant_reference,
    silu_mul_quant,
    silu_mul_quant_reference,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
CUDA = "cuda"


def _codes_agree(a, b, *, max_fraction: float) -> None:
    """Scales within float32 rounding of a different reduction order; almost all codes equal."""
    assert a.codes.shape == b.codes.shape and a.scale.shape == b.scale.shape
    torch.testing.assert_close(a.scale, b.scale, rtol=2e-2, atol=0)
    differ = (a.codes.view(torch.uint8) != b.codes.view(torch.uint8)).float().mean().item()
    assert differ <= max_fraction, differ


def _bitwise(a, b) -> None:
    """Same codes and scales, bit for bit (scales compared on their float32 bits)."""
    assert torch.equal(a.codes.view(torch.uint8), b.codes.view(torch.uint8))
    sa, sb = a.scale.contiguous().view(torch.int32), b.scale.contiguous().view(torch.int32)
    assert torch.equal(sa, sb)


@pytest.mark.parametrize("rows", [1, 64, 1000])
@pytest.mark.parametrize("hidden", [4096, 3584, 1024, 128])
def test_fused_norm_quant_equals_the_trainers_norm_then_quant_bitwise(rows, hidden):
    """Jet-RL: the engine's fused add+RMSNorm+quant gives the trainer forward's codes exactly
    (``rms_norm(exact=False)`` then ``per_token_group_quant``), at any number of rows."""
    from fp8rl.kernels.invariant import rms_norm

    gen = torch.Generator(device=CUDA).manual_seed(rows)
    x = torch.randn(rows, hidden, device=CUDA, generator=gen, dtype=torch.bfloat16)
    d = torch.randn(rows, hidden, device=CUDA, generator=gen, dtype=torch.bfloat16)
    w = torch.rand(hidden, device=CUDA, generator=gen) + 0.5
    res, q = add_rms_norm_quant(x, d, w, 1e-5)
    assert torch.equal(res, x + d)
    trainer_normed = rms_norm(x + d, w, 1e-5)
    _bitwise(q, per_token_group_quant(trainer_normed))
    _bitwise(add_rms_norm_quant(x, None, w, 1e-5)[1], per_token_group_quant(rms_norm(x, w, 1e-5)))
    assert torch.equal(rms_norm(x[-1:] + d[-1:], w, 1e-5)[0], trainer_normed[-1])  # row-invariant
    # and the torch float32 composition (the CPU truth) up to its reduction order
    _codes_agree(q, add_rms_norm_quant_reference(x, d, w, 1e-5)[1], max_fraction=2e-3)


@pytest.mark.parametrize("rows", [1, 64, 1000])
@pytest.mark.parametrize("inter", [14336, 2816, 384])
def test_fused_swiglu_quant_equals_the_trainers_silu_mul_then_quant_bitwise(rows, inter):
    from fp8rl.kernels.invariant import silu_mul

    gu = torch.randn(rows, 2 * inter, device=CUDA, dtype=torch.bfloat16) * 3
    gate, up = gu[:, :inter], gu[:, inter:]
    q = silu_mul_quant(gate, up)
    _bitwise(q, per_token_group_quant(silu_mul(gate, up)))
    # torch's F.silu (CUDA expf) vs Triton's exp: a few BF16 roundings flip (5 of 384 codes
    # differed at rows=1, inter=384 on the H200)
    _codes_agree(q, silu_mul_quant_reference(gate, up), max_fraction=2e-2)


def test_fast_norm_and_silu_gradients_match_the_torch_ops():
    from fp8rl.kernels.fused import rms_norm_fast, rms_norm_reference, silu_mul_fast

    x = torch.randn(8, 16, 1024, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.rand(1024, device=CUDA) + 0.5).requires_grad_()
    g = torch.randn(8, 16, 512, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
    u = torch.randn(8, 16, 512, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
    fast = (rms_norm_fast(x, w, 1e-5).float().square().sum(), silu_mul_fast(g, u).float().sum())
    ref = (rms_norm_reference(x, w, 1e-5).float().square().sum(),
           (torch.nn.functional.silu(g) * u).float().sum())  # fmt: skip
    for out_fast, out_ref, inputs in zip(fast, ref, [(x, w), (g, u)], strict=True):
        torch.testing.assert_close(out_fast, out_ref, rtol=1e-2, atol=0)
        for a, b in zip(
            torch.autograd.grad(out_fast, inputs), torch.autograd.grad(out_ref, inputs), strict=True
        ):
            torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


def test_fused_quant_raises_on_nan_when_checking():
    x = torch.randn(4, 256, device=CUDA, dtype=torch.bfloat16)
    x[2, 130] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        add_rms_norm_quant(x, None, torch.ones(256, device=CUDA), 1e-5, check_finite=True)


SHAPES = [
    (1, 6144, 4096),
    (16, 4096, 4096),
    (64, 28672, 4096),
    (100, 4096, 14336),
    (256, 3584, 18944),
]


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_decode_gemm_matches_the_emulation_and_the_quantized_path(m, n, k):
    from fp8rl.kernels import gemm_decode_triton as dec

    x = torch.randn(m, k, device=CUDA, dtype=torch.bfloat16)
    w = per_block_quant(torch.randn(n, k, device=CUDA, dtype=torch.bfloat16) * 0.02)
    xq = per_token_group_quant(x)
    ref = fp8_gemm_reference(xq, w, out_dtype=torch.float32)
    for split in (1, 2, 4, 8):
        cfg = dec.DecodeConfig(dec.block_m_for(m), 64, split)
        out, scales = dec.fp8_gemm_decode(x, w, out_dtype=torch.float32, config=cfg)
        assert torch.equal(scales.view(torch.int32), xq.scale.contiguous().view(torch.int32))
        assert ((out - ref).norm() / ref.norm()).item() < 1e-3  # as the other FP8 GEMMs
        again, _ = dec.fp8_gemm_decode(xq, w, out_dtype=torch.float32, config=cfg)
        assert torch.equal(out, again)  # prologue quant = quantized input; deterministic split-K
    assert int(dec._LOCKS[torch.device(CUDA, torch.cuda.current_device())].abs().sum()) == 0


# (BLOCK_M, warps, scale_ahead, k_trip) at 3 stages; fp8_gemm_decode lowers the stages where
# the tiles would not fit (4 blocks of 128 rows; 4 blocks of a BF16 prologue input)
LOOP_VARIANTS = [
    (64, 4, 1, 1), (64, 4, 0, 2), (64, 4, 1, 2), (64, 4, 0, 4), (64, 4, 1, 4),
    (128, 4, 1, 2), (128, 8, 1, 2), (128, 8, 0, 1), (128, 8, 1, 4),
]  # fmt: skip


@pytest.mark.parametrize(("m", "n", "k"), [*SHAPES, (8, 4096, 4224)])  # 33 K blocks: ragged
def test_decode_gemm_loop_variants_are_bitwise_the_plain_loop(m, n, k):
    """Scales loaded a trip early, two or four K blocks per trip and 128-row tiles (one or two
    warpgroups) add the same products in the same order: bitwise the one-block loop of 64-row
    tiles, from codes and with the prologue quant."""
    from fp8rl.kernels import gemm_decode_triton as dec

    x = torch.randn(m, k, device=CUDA, dtype=torch.bfloat16)
    w = per_block_quant(torch.randn(n, k, device=CUDA, dtype=torch.bfloat16) * 0.02)
    xq = per_token_group_quant(x)
    differ = {}
    for dtype in (torch.bfloat16, torch.float32):
        plain = dec.fp8_gemm_decode(xq, w, out_dtype=dtype, config=dec.DecodeConfig(64, 64, 1))[0]
        for bm, warps, ahead, trip in LOOP_VARIANTS:
            cfg = dec.DecodeConfig(bm, 64, 1, warps, 3, ahead, trip)
            codes = dec.fp8_gemm_decode(xq, w, out_dtype=dtype, config=cfg)[0]
            fused, scales = dec.fp8_gemm_decode(x, w, out_dtype=dtype, config=cfg)
            assert torch.equal(scales, xq.scale.contiguous()), cfg
            for path, out in (("codes", codes), ("prologue", fused)):
                if not torch.equal(out, plain):
                    differ[(str(dtype), bm, warps, ahead, trip, path)] = int((out != plain).sum())
    assert not differ, differ


def _parity_safe_rows() -> list[tuple[int, int, int]]:
    from fp8rl.kernels import gemm_decode_triton as dec

    return sorted(dec._parity_safe_table())


@pytest.mark.parametrize(("bucket", "n", "k"), _parity_safe_rows())
def test_default_decode_dispatch_rows_are_bitwise_the_trainers_scaled_mm(bucket, n, k):
    """Every (M bucket, N, K) the fast path gives the decode kernel by default must stay bitwise
    the trainer's FProp rows (``scaled_mm`` at M = 4096), at both ends of the bucket."""
    from fp8rl.kernels import gemm_decode_triton as dec

    assert dec.decode_wins(bucket, n, k) and dec.decode_config(bucket, n, k).keeps_k_order
    w = per_block_quant(torch.randn(n, k, device=CUDA, dtype=torch.bfloat16) * 0.02)
    x = torch.randn(4096, k, device=CUDA, dtype=torch.bfloat16)
    trainer = fp8_gemm(per_token_group_quant(x), w, out_dtype=torch.bfloat16)
    for m in sorted({bucket // 2 + 1, bucket}):
        rows = slice(1000, 1000 + m)
        assert dec.decode_wins(m, n, k)
        rollout = fp8_gemm(per_token_group_quant(x[rows]), w, out_dtype=torch.bfloat16)
        assert torch.equal(rollout, trainer[rows]), (m, n, k)


def test_fast_fp8_linear_equals_the_trainer_forward_bitwise_at_decode_sizes():
    layer = FP8Linear(4096, 6144, bias=False, device=CUDA, dtype=torch.bfloat16)
    x = torch.randn(48, 4096, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
    train = layer(x)
    with torch.no_grad():
        infer = fp8_linear(x.detach(), layer.quantized_weight())
    assert torch.equal(train.detach(), infer)


def test_decode_gemm_replays_from_a_cuda_graph():
    from fp8rl.kernels import gemm_decode_triton as dec

    w = per_block_quant(torch.randn(4096, 4096, device=CUDA, dtype=torch.bfloat16) * 0.02)
    x = torch.randn(32, 4096, device=CUDA, dtype=torch.bfloat16)
    cfg = dec.DecodeConfig(32, 64, 4)
    eager = dec.fp8_gemm_decode(x, w, out_dtype=torch.bfloat16, config=cfg)[0]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        dec.fp8_gemm_decode(x, w, out_dtype=torch.bfloat16, config=cfg)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dec.fp8_gemm_decode(x, w, out_dtype=torch.bfloat16, config=cfg)[0]
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


def test_exact_mode_rows_are_bitwise_equal_at_m1_and_m4096():
    w = per_block_quant(torch.randn(4096, 4096, device=CUDA, dtype=torch.bfloat16) * 0.02)
    x = torch.randn(4096, 4096, device=CUDA, dtype=torch.bfloat16)
    big = fp8_gemm(per_token_group_quant(x), w, out_dtype=torch.bfloat16, exact=True)
    for row in (0, 17, 4095):
        one = fp8_gemm(
            per_token_group_quant(x[row : row + 1]), w, out_dtype=torch.bfloat16, exact=True
        )
        assert torch.equal(one[0], big[row])


def test_fused_inference_decoder_is_close_to_the_unfused_one():
    from dataclasses import replace

    from fp8rl.protocol import QuantConfig
    from fp8rl.workers.model.build import build_decoder
    from fp8rl.workers.model.config import PRESETS
    from fp8rl.workers.model.linear import LayerPrecision

    cfg = replace(PRESETS["small-llama"], num_hidden_layers=2)
    precision = LayerPrecision(fp8=True, quant=QuantConfig(), trainable=False)
    model = build_decoder(
        cfg, precision, state_dict=None, max_positions=64, param_dtype=torch.bfloat16, device=CUDA
    )
    ids = torch.randint(0, cfg.vocab_size, (4, 32), device=CUDA)
    pos = torch.arange(32, device=CUDA).expand(4, 32)
    lens = torch.full((4,), 32, device=CUDA)
    with torch.inference_mode():
        assert model.model.layers[0].fused_ready()
        fused = model(ids, pos, lens).float()
        for layer in model.model.layers:
            layer.self_attn.fused_qkv = layer.mlp.fused_gate_up = None
        unfused = model(ids, pos, lens).float()
    rel = ((fused - unfused).norm() / unfused.norm()).item()
    assert rel < 2e-2, rel
