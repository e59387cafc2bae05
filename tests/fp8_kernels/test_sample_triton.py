"""The one-kernel seeded draw (``kernels.sample_triton``, run by the engine for unfiltered
sampling on CUDA): under TRITON_INTERPRET=1 it picks the torch draw's token on random logits,
never a token of zero probability, follows the probabilities, and refuses bad arguments."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

INTERPRETED = textwrap.dedent(
    """
    import torch
    from fp8rl.kernels.sample_triton import draw_triton
    from fp8rl.workers.rollout.sampling import counter_uniforms, inverse_cdf_sample, sequence_seed

    torch.manual_seed(0)
    b, v = 48, 5000  # 3 loop trips, the last one partial
    logits = (torch.randn(b, v) * 3).to(torch.float16)
    logits[:, 100:300] = float("-inf")
    logits[:, -1] = float("-inf")
    u = counter_uniforms(torch.tensor([sequence_seed(1, i) for i in range(b)]), 3)
    u[0], u[1] = 1e-12, 1 - 2**-47  # the first and the last live token
    for t in (1.0, 0.7):
        got = draw_triton(logits, u, t)
        ref = inverse_cdf_sample(torch.softmax(logits.float() / t, -1), u)
        dead = ((got >= 100) & (got < 300)) | (got == v - 1)
        print(f"case t={t} same={int((got == ref).sum())} dead={int(dead.sum())} "
              f"ends={got[0].item()},{got[1].item()}")
    probs = torch.tensor([0.2, 0.0, 0.5, 0.3])
    n = 2000
    u = counter_uniforms(torch.tensor([sequence_seed(9, i) for i in range(n)]), 0)
    got = draw_triton(probs.log().expand(n, 4).contiguous(), u, 1.0)
    freq = torch.bincount(got, minlength=4) / n
    print("freq " + " ".join(f"{f:.4f}" for f in freq.tolist()))
    """
)


def test_interpreted_draw_matches_the_torch_draw_and_skips_zero_mass_tokens():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    cases = [line for line in run.stdout.splitlines() if line.startswith("case")]
    assert len(cases) == 2
    for line in cases:
        assert "same=48 " in line and "dead=0 " in line, line
        assert line.endswith("ends=0,4998"), line
    freq = [float(f) for f in run.stdout.split("freq ")[1].split()]
    assert freq[1] == 0.0
    assert freq == pytest.approx([0.2, 0.0, 0.5, 0.3], abs=0.04)  # 2000 draws: 3.6 sigma


def test_a_draw_without_temperature_or_with_mismatched_uniforms_is_refused():
    pytest.importorskip("triton")
    from fp8rl.kernels.sample_triton import draw_triton

    logits = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        draw_triton(logits, torch.full((2,), 0.5, dtype=torch.float64), 0.0)
    with pytest.raises(ValueError, match=r"uniforms \[B\]"):
        draw_triton(logits, torch.full((3,), 0.5, dtype=torch.float64), 1.0)
