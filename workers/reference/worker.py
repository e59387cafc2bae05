"""ReferenceWorker: the frozen initial policy, scored with the trainer's forward precision.

In ``unified_fp8`` its linears are FP8 (the initial weights' codes), so the KL term compares two
policies computed the same way; in ``bf16``/``fp8_rollout`` it is BF16 like the trainer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fp8rl.protocol import Handshake, ModelSpec, PrecisionSpec, WeightUpdate
from fp8rl.workers.common import handshake, load_model, pick_device
from fp8rl.workers.host_memory import returns_free_memory
from fp8rl.workers.model.build import layer_precision
from fp8rl.workers.model.scoring import PackedBatch, response_logprobs
from fp8rl.workers.weight_sync.receiver import WeightReceiver


class ReferenceWorker:
    """Reference policy actor. Args: model, precision sub-specs; device; micro_batch_size."""

    @returns_free_memory
    def __init__(
        self,
        model: ModelSpec,
        precision: PrecisionSpec,
        *,
        device: str = "auto",
        micro_batch_size: int = 8,
        seed: int = 0,
    ) -> None:
        self.precision, self.micro = precision, micro_batch_size
        self.device = pick_device(device)
        self.layer_precision = layer_precision(model, precision, role="reference", trainable=False)
        self.model, _ = load_model(
            model, precision, role="reference", trainable=False, device=self.device, seed=seed
        )
        self.fingerprint = precision.quant.fingerprint() if self.layer_precision.fp8 else None
        self.receiver = WeightReceiver(self.layer_precision, self.fingerprint)

    def handshake(self) -> Handshake:
        """Quant contract report for the driver."""
        return handshake("reference", self.precision, self.layer_precision, device=self.device)

    @returns_free_memory
    @torch.no_grad()
    def logprobs(self, batch: PackedBatch, *, temperature: float) -> Tensor:
        """Reference logprobs [B, R] (float32, CPU) of the batch's response tokens."""
        out = []
        width = batch.response_ids.shape[1]
        for start in range(0, batch.input_ids.shape[0], self.micro):
            micro = batch.select(slice(start, start + self.micro)).to(self.device)
            logp = response_logprobs(self.model, micro, temperature=temperature).cpu()
            out.append(torch.nn.functional.pad(logp, (0, width - logp.shape[1])))
        return torch.cat(out)

    def init_transport(self, name: str, **kwargs: Any) -> None:
        """Receive weight updates through transport ``name`` (``nccl`` joins its process group)."""
        self.receiver.join(name, **kwargs)

    @returns_free_memory
    def apply_weights(self, update: WeightUpdate, handle: Any) -> int:
        """Load the initial policy from the trainer (version 0 only: the reference never moves).

        Raises:
            WeightUpdateRefused / ValueError: a bad update, or any version after 0.
        """
        if update.version != 0:
            raise ValueError(
                f"the reference policy is frozen; refusing weights of version {update.version}"
            )
        return self.receiver.apply(self.model, update, handle, device=self.device)
