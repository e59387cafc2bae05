"""RolloutBackend: the interface every rollout engine implements (native, vLLM, SGLang).

One Ray actor per engine. The driver talks to engines only through these methods, so a new
backend plugs in without touching the loop. Weight updates arrive as a typed ``WeightUpdate``
manifest plus a transport handle (tensors travel out of band); an update is validated whole
before anything is written, and a refused update leaves weights and version unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from fp8rl.protocol import Handshake, RolloutRequest, RolloutResult, WeightUpdate


class RolloutBackend(ABC):
    """A rollout engine actor. Subclasses: ``RolloutWorker`` (native), ``VllmRolloutWorker``."""

    @abstractmethod
    def handshake(self) -> Handshake:
        """Quant contract report (precision, fingerprint, device) checked by the driver."""

    @abstractmethod
    def generate(self, request: RolloutRequest) -> RolloutResult:
        """n samples per prompt: token ids, per-token logprobs (float, nats), finish reasons,
        each tagged with the policy version and quant fingerprint that produced it."""

    @abstractmethod
    def init_transport(self, name: str, **kwargs: Any) -> None:
        """Receive weight updates through transport ``name`` (``nccl`` joins its group)."""

    @abstractmethod
    def apply_weights(self, update: WeightUpdate, handle: Any) -> int:
        """Validate and apply a whole update; return the new policy version.

        Raises:
            WeightUpdateRefused: naming each bad tensor; weights and version are unchanged.
        """

    @abstractmethod
    def current_version(self) -> int:
        """Policy version of the weights held (0 before the first update)."""

    def gpu_location(self) -> tuple[str, str | None]:
        """``(Ray node id, GPU UUID or None)`` of the engine's device (transport choice)."""
        from fp8rl.workers.common import gpu_location

        return gpu_location(self.device)

    def release_memory(self) -> None:
        """Free the KV cache (and, where the backend can, weights) while the trainer runs on a
        shared GPU. Default: nothing to release."""
        return None

    def resume_memory(self) -> None:
        """Re-allocate what ``release_memory`` freed before the next ``generate``."""
        return None

    def close(self) -> None:
        """Release the engine's processes and memory; the actor may then be killed."""
        return None
