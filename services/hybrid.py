"""Driver side of ``resources.hybrid_engine``: start the one hybrid actor and hand the loop an
engine handle onto it (``workers.hybrid.HybridWorker``)."""

from __future__ import annotations

from typing import Any

import ray

from fp8rl.protocol import JobSpec


class EngineView:
    """The rollout engine inside a ``HybridWorker`` actor, used like an engine actor handle:
    ``view.generate.remote(request)`` is ``actor.rollout.remote("generate", request)``.

    Args:
        actor: the ``HybridWorker`` actor handle.
    """

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def __getattr__(self, method: str) -> _EngineMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return _EngineMethod(self.actor, method)


class _EngineMethod:
    def __init__(self, actor: Any, method: str) -> None:
        self.actor, self.method = actor, method

    def remote(self, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        """Submit the engine call; an ObjectRef of its result."""
        return self.actor.rollout.remote(self.method, *args, **kwargs)


def launch_hybrid(job: JobSpec, options: dict[str, Any]) -> tuple[Any, EngineView]:
    """Start the hybrid actor with Ray ``options`` (trainer rank 0's placement); return it and
    the engine view of it."""
    from fp8rl.workers.hybrid import HybridWorker

    actor = (
        ray.remote(HybridWorker)
        .options(**options)
        .remote(
            job.model,
            job.trainer,
            job.algorithm,
            job.precision,
            job.rollout,
            total_steps=job.steps,
            batch_size=job.batch_size,
            device=job.resources.device,
            seed=job.seed,
        )
    )
    return actor, EngineView(actor)
