"""HybridWorker: the trainer and the native rollout engine in one process (verl's hybrid engine).

``resources.hybrid_engine: true``. On a small machine a separate engine process costs a second
copy of the torch runtime and of the FP8 weights (about 0.5 GB on the quickstart) while it waits
for the trainer. Here the engine is an attribute of the trainer's actor:

- the trainer's methods are the actor's own (``train``, ``logprobs``, ``publish`` …);
- the engine's methods are reached through ``rollout(method, …)``; the driver holds an
  ``services.hybrid.EngineView`` that turns ``view.generate.remote(req)`` into that call, so the
  loop, the weight sync and the evaluator treat it like any engine actor;
- weight updates travel by the ``local`` transport (the tensors, not a copy through Ray's object
  store) and are validated whole before the engine writes them, as on every transport;
- the two roles take turns (one actor runs one method at a time), which is how the phases of a
  step run on one machine anyway.
"""

from __future__ import annotations

from typing import Any

from fp8rl.protocol import AlgorithmSpec, ModelSpec, PrecisionSpec, RolloutSpec, TrainerSpec
from fp8rl.workers.rollout.worker import RolloutWorker
from fp8rl.workers.trainer.worker import TrainerWorker


class HybridWorker(TrainerWorker):
    """Trainer rank 0 (one rank, not sharded) with a native ``RolloutWorker`` in its process.

    Args:
        model, trainer, algorithm, precision, rollout: sub-specs of the JobSpec.
        total_steps, batch_size, device, seed: as ``TrainerWorker`` (the engine uses the same
            device and seed).

    Raises:
        ValueError: the trainer is sharded or either backend is not native.
    """

    def __init__(
        self,
        model: ModelSpec,
        trainer: TrainerSpec,
        algorithm: AlgorithmSpec,
        precision: PrecisionSpec,
        rollout: RolloutSpec,
        *,
        total_steps: int,
        batch_size: int,
        device: str = "auto",
        seed: int = 0,
    ) -> None:
        if trainer.num_workers != 1 or rollout.num_workers != 1:
            raise ValueError(
                "a hybrid worker holds one trainer rank and one engine; got "
                f"trainer.num_workers={trainer.num_workers}, rollout.num_workers={rollout.num_workers}"
            )
        super().__init__(
            model,
            trainer,
            algorithm,
            precision,
            total_steps=total_steps,
            batch_size=batch_size,
            device=device,
            seed=seed,
        )
        self.engine = RolloutWorker(model, rollout, precision, device=device, rank=0, seed=seed)
        self.publisher.join("local")
        self.engine.receiver.join("local")

    def rollout(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call the engine's public ``method`` (``generate``, ``apply_weights`` …) in this process.

        Raises:
            AttributeError: the engine has no public method ``method``.
        """
        target = None if method.startswith("_") else getattr(self.engine, method, None)
        if not callable(target):
            raise AttributeError(f"the rollout engine has no method {method!r}")
        return target(*args, **kwargs)
