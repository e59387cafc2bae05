"""trainer.offload=optimizer: AdamW with host-resident state takes the steps torch's AdamW takes."""

from __future__ import annotations

import torch

from fp8rl.workers.trainer.sharding import HostAdamW


def test_host_adamw_matches_torch_adamw_bit_for_bit_and_keeps_state_on_the_host():
    torch.manual_seed(0)
    params = [torch.randn(5, 3, requires_grad=True), torch.randn(7, requires_grad=True)]
    twins = [p.detach().clone().requires_grad_(True) for p in params]
    kw = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    host, reference = HostAdamW(params, **kw), torch.optim.AdamW(twins, foreach=False, **kw)
    for _ in range(3):
        grads = [torch.randn_like(p) for p in params]
        for p, t, g in zip(params, twins, grads, strict=True):
            p.grad, t.grad = g.clone(), g.clone()
        host.step()
        reference.step()
    for p, t in zip(params, twins, strict=True):
        assert torch.equal(p, t)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(host.state[p][key], reference.state[t][key])
            assert host.state[p][key].device.type == "cpu"
    assert host.state_dict()["state"][0].keys() == reference.state_dict()["state"][0].keys()
