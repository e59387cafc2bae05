"""A one-rank gloo process group with Megatron's parallel state (TP = PP = 1) for CPU tests."""

from __future__ import annotations

import warnings

import pytest
from megatron_configs import free_port


@pytest.fixture(scope="module")
def single_rank():
    """Megatron parallel state on one gloo rank; torn down after the module."""
    warnings.filterwarnings("ignore", message=".*Transformer Engine.*")
    from fp8rl.workers.trainer.megatron.parallel import init_parallel, shutdown_parallel

    layout = init_parallel(rank=0, world=1, tp=1, pp=1, address="127.0.0.1", port=free_port())
    yield layout
    shutdown_parallel()
