"""TrainerWorker: the native torch policy trainer (one Ray actor = one data-parallel rank).

Owns the master weights (FP32 or BF16) and AdamW state. In ``unified_fp8`` its linear layers are
FP8Linear: the forward quantizes activations 1×128 and uses the 128×128 weight quantization
cached once per optimizer step — the same codes ``publish`` ships to the engines.
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from fp8rl.kernels.invariant import token_logprobs
from fp8rl.protocol import (
    AlgorithmSpec,
    Handshake,
    ModelSpec,
    PrecisionSpec,
    TrainerSpec,
    WeightUpdate,
)
from fp8rl.workers.algorithms import entropy_from_logits, loss_denominator, rl_objective
from fp8rl.workers.common import handshake, load_model, pick_device
from fp8rl.workers.model.build import DTYPES, layer_precision
from fp8rl.workers.model.scoring import PackedBatch, response_hidden
from fp8rl.workers.trainer.batch import TrainBatch
from fp8rl.workers.trainer.schedule import lr_factor
from fp8rl.workers.weight_sync.transport import make_transport
from fp8rl.workers.weight_sync.update import build_update


class TrainerWorker:
    """Policy trainer. Gets its own sub-specs only.

    Args:
        model, trainer, algorithm, precision: sub-specs of the JobSpec.
        total_steps: RL steps of the run (for the LR schedule).
        batch_size: sequences per rollout batch (prompts_per_step × n).
        device: ``auto`` | ``cpu`` | ``cuda``.
        seed: initialisation/dropout seed.
    """

    def __init__(
        self,
        model: ModelSpec,
        trainer: TrainerSpec,
        algorithm: AlgorithmSpec,
        precision: PrecisionSpec,
        *,
        total_steps: int,
        batch_size: int,
        device: str = "auto",
        seed: int = 0,
        rank: int = 0,
    ) -> None:
        if trainer.backend != "native":
            raise ValueError(
                f"TrainerWorker is the native backend; got trainer.backend={trainer.backend}"
            )
        self.spec, self.algorithm, self.precision, self.rank = trainer, algorithm, precision, rank
        self.device = pick_device(device)
        torch.manual_seed(seed)
        self.model, source = load_model(
            model,
            precision,
            role="trainer",
            trainable=True,
            param_dtype=DTYPES[trainer.master_dtype],
            device=self.device,
            seed=seed,
        )
        self.source = dataclasses.replace(source, state_dict=None)  # the model holds the weights
        self.model.gradient_checkpointing = trainer.gradient_checkpointing
        self.layer_precision = layer_precision(model, precision, role="trainer", trainable=True)
        self.receivers = {
            role: layer_precision(model, precision, role=role, trainable=False)
            for role in ("rollout", "reference")
        }
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=trainer.lr,
            betas=trainer.betas,
            eps=trainer.eps,
            weight_decay=trainer.weight_decay,
        )
        mini = trainer.mini_batch_size or batch_size
        updates_per_step = trainer.epochs_per_step * math.ceil(batch_size / mini)
        total = total_steps * updates_per_step
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_factor(
                s,
                warmup_steps=trainer.warmup_steps,
                total_steps=total,
                schedule=trainer.lr_schedule,
                min_ratio=trainer.min_lr_ratio,
            ),
        )
        self.version = 0
        self.transports = {"object_store": make_transport("object_store")}
        self.transport = (
            "object_store"  # the one engines use (reference syncs go through the object store)
        )

    def handshake(self) -> Handshake:
        """Quant contract report for the driver."""
        return handshake(
            "trainer", self.precision, self.layer_precision, device=self.device, rank=self.rank
        )

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch) -> Tensor:
        """Current-policy logprobs [B, R] (float32, CPU) of the batch's response tokens.

        With an FP8 KV cache this scoring pass also measures K/V amax for the next scales.
        """
        self.model.eval()
        out = []
        with self._observing_kv():
            for start in range(0, len(batch), self.spec.micro_batch_size):
                micro = batch.select(slice(start, start + self.spec.micro_batch_size)).to(
                    self.device
                )
                logp, _ = self._score(micro, with_entropy=False)
                out.append(_pad_to(logp.cpu(), batch.packed.response_ids.shape[1]))
        return torch.cat(out)

    @torch.no_grad()
    def calibrate_kv(self, batch: PackedBatch) -> None:
        """Initial FP8 KV scales from a forward over ``batch`` (a no-op without an FP8 KV cache)."""
        attns = self._kv_modules()
        if not attns:
            return
        for attn in attns:  # provisional unit scales: amax is observed before quantization
            attn.k_scale.fill_(1.0)
            attn.v_scale.fill_(1.0)
        with self._observing_kv():
            for start in range(0, batch.input_ids.shape[0], self.spec.micro_batch_size):
                micro = batch.select(slice(start, start + self.spec.micro_batch_size)).to(
                    self.device
                )
                self.model(micro.input_ids, micro.positions, micro.lengths)
        for attn in attns:
            attn.recalibrate_kv()

    def _kv_modules(self) -> list[Any]:
        return [m for m in self.model.modules() if getattr(m, "kv_fp8", False)]

    @contextmanager
    def _observing_kv(self):
        attns = self._kv_modules()
        for attn in attns:
            attn.observe_kv = True
        try:
            yield
        finally:
            for attn in attns:
                attn.observe_kv = False

    def train(self, batch: TrainBatch) -> dict[str, float]:
        """PPO epochs × mini-batches over ``batch``; one optimizer step per mini-batch.

        Raises:
            ValueError: the batch was generated by a policy version the spec does not accept.
        """
        lag = self.version - batch.policy_version
        if lag < 0 or lag > self.algorithm.max_off_policy_steps:
            raise ValueError(
                f"rollout batch from policy version {batch.policy_version}, trainer is at {self.version}; "
                f"algorithm.max_off_policy_steps={self.algorithm.max_off_policy_steps} allows a lag of "
                f"0..{self.algorithm.max_off_policy_steps}"
            )
        self.model.train()
        mini = self.spec.mini_batch_size or len(batch)
        sums: dict[str, float] = {}
        count = 0
        for _ in range(self.spec.epochs_per_step):
            for start in range(0, len(batch), mini):
                metrics = self._update(batch.select(slice(start, start + mini)))
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        return {k: v / count for k, v in sums.items()}

    def _update(self, mini: TrainBatch) -> dict[str, float]:
        """One optimizer step over a mini-batch, accumulating micro-batch gradients."""
        self.optimizer.zero_grad(set_to_none=True)
        denominator = loss_denominator(mini.packed.response_mask, mode=self.algorithm.loss_agg)
        sums: dict[str, float] = {}
        for start in range(0, len(mini), self.spec.micro_batch_size):
            micro = mini.select(slice(start, start + self.spec.micro_batch_size)).to(self.device)
            logp, entropy = self._score(micro, with_entropy=True)
            loss, metrics = rl_objective(
                logp,
                micro.old_logp,
                micro.advantages,
                micro.packed.response_mask,
                spec=self.algorithm,
                ref_logp=micro.ref_logp,
                entropy=entropy,
                rollout_logp=micro.rollout_logp,
                loss_denominator=denominator,
            )
            loss.backward()
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # no gradients held while the engines roll out
        self.scheduler.step()
        self._invalidate_fp8()
        for attn in self._kv_modules():  # next version's KV scales, from this step's scoring pass
            attn.recalibrate_kv()
        self.version += 1
        micro_batches = math.ceil(len(mini) / self.spec.micro_batch_size)
        out = {k: (v if k in _SUMMED else v / micro_batches) for k, v in sums.items()}
        out["actor/grad_norm"] = float(grad_norm)
        out["actor/lr"] = self.scheduler.get_last_lr()[0]
        return out

    def _score(self, micro: TrainBatch, *, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        """Logprobs [b, r] of the response tokens (and per-token entropy when asked)."""
        hidden = response_hidden(self.model, micro.packed)
        logits = self.model.logits(hidden)
        logp = token_logprobs(
            logits,
            micro.packed.response_ids,
            temperature=micro.temperature,
            exact=self.model.precision.exact,
        )
        logp = logp.masked_fill(~micro.packed.response_mask, 0.0)
        entropy = None
        if with_entropy:
            scaled = logits if micro.temperature <= 0 else logits.float() / micro.temperature
            entropy = entropy_from_logits(scaled)
            if self.algorithm.entropy_coef == 0:
                entropy = entropy.detach()
        return logp, entropy

    def _invalidate_fp8(self) -> None:
        for module in self.model.modules():
            if hasattr(module, "invalidate_quantized"):
                module.invalidate_quantized()

    def state_dict(self, include_optimizer: bool = True) -> dict[str, Any]:
        """Everything needed to resume training exactly: master weights (CPU tensors, HF names),
        AdamW state, LR scheduler, policy version and this process's RNG states.

        ``include_optimizer=False`` (``checkpoint.save_optimizer=false``) leaves the AdamW
        moments out (``{}``) so they are not shipped to the driver at all."""
        return {
            "model": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict() if include_optimizer else {},
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()``; the FP8 weight caches are rebuilt from the restored weights."""
        with torch.no_grad():
            self.model.load_state_dict({k: v.to(self.device) for k, v in state["model"].items()})
        if state["optimizer"]:  # empty: saved with checkpoint.save_optimizer=false
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self._invalidate_fp8()

    def free_address(self) -> tuple[str, int]:
        """This node's IP and a free TCP port (rendezvous of the NCCL weight-broadcast group)."""
        import socket

        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            return ray.util.get_node_ip_address(), sock.getsockname()[1]

    def init_transport(self, name: str, **kwargs: Any) -> None:
        """Use transport ``name`` for weight updates (``nccl`` joins its process group as rank 0)."""
        self.transports[name] = make_transport(name, **kwargs)
        self.transport = name

    @torch.no_grad()
    def publish(self, *, role: str = "rollout") -> tuple[WeightUpdate, Any]:
        """WeightUpdate (manifest) + transport handle of the current weights in ``role``'s layout
        (``rollout`` engines, or the ``reference`` for the initial sync)."""
        receiver = self.receivers[role]
        fingerprint = self.precision.quant.fingerprint() if receiver.fp8 else None
        transport = self.transports[self.transport if role == "rollout" else "object_store"]
        update, payload = build_update(
            self.model,
            receiver=receiver,
            version=self.version,
            fingerprint=fingerprint,
            transport=transport.name,
        )
        if transport.name == "nccl":  # receivers need the manifest first; ``broadcast`` sends
            self._pending = payload
            return update, None
        return update, transport.send(payload)

    def broadcast(self) -> None:
        """Send the last published payload over the NCCL group (engines receive concurrently)."""
        payload, self._pending = self._pending, None
        self.transports["nccl"].send(payload)


_SUMMED = {"actor/pg_loss", "actor/kl", "actor/entropy"}
"""Objective metrics computed with the mini-batch denominator: micro-batch values add up."""


def _pad_to(x: Tensor, width: int) -> Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))
