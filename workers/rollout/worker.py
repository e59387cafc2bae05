"""RolloutWorker: one rollout engine per actor, behind the typed request/result protocol.

The native backend is fp8rl's engine on the shared decoder. Every result records the policy
version and quant fingerprint of the weights that produced it. Weight updates are validated
completely before anything is written (``weight_sync.receiver.WeightReceiver``); a refused update
leaves weights and version as they were.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from fp8rl.protocol import (
    Handshake,
    ModelSpec,
    PrecisionSpec,
    RolloutRequest,
    RolloutResult,
    RolloutSample,
    RolloutSpec,
    WeightUpdate,
)
from fp8rl.workers.common import handshake, load_model, pick_device
from fp8rl.workers.host_memory import release_storage, restore_storage, returns_free_memory
from fp8rl.workers.model.build import layer_precision
from fp8rl.workers.rollout.backend import RolloutBackend
from fp8rl.workers.rollout.engine import NativeEngine
from fp8rl.workers.weight_sync.layout import weight_tensors
from fp8rl.workers.weight_sync.receiver import WeightReceiver


class RolloutWorker(RolloutBackend):
    """Native rollout engine actor.

    Args:
        model, rollout, precision: its sub-specs. device: ``auto`` | ``cpu`` | ``cuda``.
        rank: index among rollout workers. seed: weight-init seed for random presets.
    """

    @returns_free_memory
    def __init__(
        self,
        model: ModelSpec,
        rollout: RolloutSpec,
        precision: PrecisionSpec,
        *,
        device: str = "auto",
        rank: int = 0,
        seed: int = 0,
    ) -> None:
        if rollout.backend != "native":
            raise ValueError(
                f"RolloutWorker is the native backend; got rollout.backend={rollout.backend}"
            )
        self.spec, self.precision, self.rank = rollout, precision, rank
        self.device = pick_device(device)
        self.layer_precision = layer_precision(model, precision, role="rollout", trainable=False)
        self.model, source = load_model(
            model, precision, role="rollout", trainable=False, device=self.device, seed=seed
        )
        eos = list(source.config.eos_token_id)
        self.engine = NativeEngine(
            self.model,
            eos_token_ids=eos,
            max_batch_size=rollout.max_batch_size,
            cuda_graphs=rollout.cuda_graphs,
        )
        self.fingerprint = precision.quant.fingerprint() if self.layer_precision.fp8 else None
        self.receiver = WeightReceiver(self.layer_precision, self.fingerprint)
        self._released: list[tuple[Any, int]] = []  # (storage, bytes) freed by release_memory

    def current_version(self) -> int:
        """Policy version of the weights held (0 until the first update)."""
        return self.receiver.version or 0

    def handshake(self) -> Handshake:
        """Quant contract report for the driver."""
        return handshake(
            "rollout", self.precision, self.layer_precision, device=self.device, rank=self.rank
        )

    @returns_free_memory
    def generate(self, request: RolloutRequest) -> RolloutResult:
        """n samples per prompt with token ids, logprobs, finish reasons, version and fingerprint."""
        if self._released:
            raise RuntimeError(
                "the engine's weights were released for training (release_memory) and no weight "
                "update has been applied since: apply one before generate"
            )
        start = time.perf_counter()
        prompts = [p.token_ids for p in request.prompts]
        groups = self.engine.generate(prompts, request.sampling, [p.seed for p in request.prompts])
        samples = [
            RolloutSample(
                prompt_id=p.prompt_id,
                sample_index=i,
                prompt_token_ids=p.token_ids,
                token_ids=g.token_ids,
                logprobs=g.logprobs,
                finish_reason=g.finish_reason,
                policy_version=self.current_version(),
                quant_fingerprint=self.fingerprint,
            )
            for p, group in zip(request.prompts, groups, strict=True)
            for i, g in enumerate(group)
        ]
        return RolloutResult(
            request_id=request.request_id,
            samples=samples,
            policy_version=self.current_version(),
            quant_fingerprint=self.fingerprint,
            backend="native",
            generation_s=time.perf_counter() - start,
        )

    def release_memory(self) -> None:
        """Give memory to the trainer beside this engine until ``resume_memory``.

        CUDA: drop the decode graphs and KV cache the engine keeps between ``generate`` calls
        and return that memory to the device (PyTorch's caching allocator keeps it otherwise);
        the FP8 weights stay. CPU (a hybrid engine in the trainer's process): free the weights'
        storage too, since the next weight update overwrites every tensor of them; until one
        is applied, ``generate`` refuses to run.
        """
        if self.engine.device.type == "cuda":
            self.engine.drop_graphs()
            torch.cuda.empty_cache()
            return
        self._released = self._released or release_storage(weight_tensors(self.model))

    def resume_memory(self) -> None:
        """Re-allocate the weights ``release_memory`` freed (contents undefined until the next
        ``apply_weights`` writes them)."""
        if self._released:
            restore_storage(self._released)

    def init_transport(self, name: str, **kwargs: Any) -> None:
        """Receive weight updates through transport ``name`` (``nccl`` joins its process group)."""
        self.receiver.join(name, **kwargs)

    @returns_free_memory
    def apply_weights(self, update: WeightUpdate, handle: Any) -> int:
        """Validate and apply a weight update; return the new version.

        Raises:
            WeightUpdateRefused: naming each bad tensor; the engine keeps its weights and version.
        """
        if self._released:
            restore_storage(self._released)  # an update before resume_memory: storage first
        version = self.receiver.apply(self.model, update, handle, device=self.device)
        self._released = []  # every weight is the update's now
        return version

    @torch.no_grad()
    def logits(self, token_ids: list[int]) -> Tensor:
        """Next-token logits [V] after ``token_ids`` (diagnostics and tests)."""
        ids = torch.tensor([token_ids], device=self.device)
        pos = torch.arange(len(token_ids), device=self.device)[None]
        hidden = self.model(ids, pos, torch.tensor([len(token_ids)], device=self.device))
        return self.model.logits(hidden[0, -1]).float().cpu()
