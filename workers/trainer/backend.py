"""TrainerBackend: the interface every trainer rank implements (native FSDP2, Megatron-core).

One Ray actor per rank; the driver calls every rank with its own shard of the batch and the
global loss denominators, and reads reduced metrics from rank 0. Collective methods
(``logprobs``, ``calibrate_kv``, ``train``, ``publish``, ``save``, ``load``) must be called on all
ranks together.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from torch import Tensor

from fp8rl.protocol import Handshake, WeightUpdate


class TrainerBackend(ABC):
    """One trainer rank."""

    @abstractmethod
    def handshake(self) -> Handshake:
        """Quant contract report (precision, fingerprint, device, rank) checked by the driver."""

    @abstractmethod
    def logprobs(self, batch: Any) -> Tensor:
        """Current-policy logprobs [B, R] (float32, CPU, nats) of this rank's response tokens."""

    @abstractmethod
    def calibrate_kv(self, batch: Any) -> None:
        """Measure K/V amax on ``batch`` (all-reduced with MAX across ranks) and set KV scales."""

    @abstractmethod
    def train(self, batch: Any) -> dict[str, float]:
        """One policy update on this rank's shard; returns metrics reduced across ranks."""

    @abstractmethod
    def init_transport(self, name: str, **kwargs: Any) -> None:
        """Set up the weight-sync group for transport ``name`` (``nccl``, ``cuda_ipc``, ...)."""

    @abstractmethod
    def publish(self, *, role: str = "rollout") -> tuple[WeightUpdate, Any]:
        """Quantize and send the current weights in ``role``'s layout; returns the manifest and
        the transport handle (rank 0; other ranks return their part of the gather)."""

    @abstractmethod
    def current_version(self) -> int:
        """Optimizer steps taken: the policy version of the weights this rank holds."""

    @abstractmethod
    def save(
        self, directory: Path, optimizer: bool = True, weights_dtype: str = "float32"
    ) -> list[str]:
        """Write this rank's shard of weights (stored as ``weights_dtype``), optimizer state
        (unless ``optimizer`` is False), scheduler and RNG state under ``directory``; returns the
        file names written (relative to ``directory``)."""

    @abstractmethod
    def load(self, directory: Path) -> int:
        """Restore what ``save`` wrote (any rank count); returns the policy version."""
