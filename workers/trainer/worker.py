"""TrainerWorker: the native torch policy trainer (one Ray actor = one data-parallel rank).

Owns the master weights (FP32 or BF16) and AdamW state. In ``unified_fp8`` its linear layers are
FP8Linear: the forward quantizes activations 1×128 and uses the 128×128 weight quantization
cached once per optimizer step — the same codes ``publish`` ships to the engines.

With ``trainer.num_workers = N > 1`` the N actors form one torch.distributed group and shard the
model with FSDP2 (``sharding.py``): each rank trains on its ``TrainShard`` of the batch (the driver
balances tokens and passes global loss denominators), metrics are reduced across ranks, K/V amax
is all-reduced with MAX, ``publish`` gathers each weight then quantizes it exactly like an
unsharded trainer, and ``save``/``load`` write and read rank shards with
``torch.distributed.checkpoint`` (any rank count on resume).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fp8rl.kernels.finite import deferred_finite_checks
from fp8rl.protocol import (
    AlgorithmSpec,
    Handshake,
    ModelSpec,
    PrecisionSpec,
    TrainerSpec,
    WeightUpdate,
)
from fp8rl.workers.common import handshake, load_model, pick_device
from fp8rl.workers.host_memory import (
    release_between_blocks,
    release_free_memory,
    returns_free_memory,
)
from fp8rl.workers.model.build import DTYPES, cast_dense, layer_precision
from fp8rl.workers.model.decoder import Decoder
from fp8rl.workers.model.scoring import PackedBatch
from fp8rl.workers.trainer import sharding
from fp8rl.workers.trainer.backend import TrainerBackend
from fp8rl.workers.trainer.batch import TrainBatch, TrainShard, micro_objective, plan_shards
from fp8rl.workers.trainer.dcp_state import load_state, save_state
from fp8rl.workers.trainer.schedule import lr_factor
from fp8rl.workers.weight_sync.publisher import WeightPublisher

DCP_DIR = "trainer"
"""Sub-directory of a checkpoint holding the ``torch.distributed.checkpoint`` shards."""

log = logging.getLogger(__name__)


class TrainerWorker(TrainerBackend):
    """Policy trainer rank. Gets its own sub-specs only.

    Args:
        model, trainer, algorithm, precision: sub-specs of the JobSpec.
        total_steps: RL steps of the run (for the LR schedule).
        batch_size: sequences per rollout batch (prompts_per_step × n).
        device: ``auto`` | ``cpu`` | ``cuda``.
        seed: initialisation/dropout seed.
        rank, world_size: this rank and the number of ranks.
        init_method: ``tcp://host:port`` of the trainer group; given → FSDP2-sharded (also at
            world_size 1). None when ``needs_group(trainer)``: call ``join`` before anything else.
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
        world_size: int = 1,
        init_method: str | None = None,
    ) -> None:
        if trainer.backend != "native":
            raise ValueError(
                f"TrainerWorker is the native backend; got trainer.backend={trainer.backend}"
            )
        self.spec, self.algorithm, self.precision, self.rank = trainer, algorithm, precision, rank
        self.model_spec, self.world_size, self.seed = model, world_size, seed
        self.device = pick_device(device)
        self.total_steps, self.batch_size = total_steps, batch_size
        self.publisher = WeightPublisher(rank=rank)
        self.version = 0
        self.sharded = False
        if init_method is not None or not needs_group(trainer):
            self.join(init_method)

    @returns_free_memory
    def join(self, init_method: str | None) -> None:
        """Build the model and optimizer; with ``init_method``, join the trainer group and shard."""
        model, trainer, precision = self.model_spec, self.spec, self.precision
        torch.manual_seed(self.seed)
        if init_method is None:
            self.model, self.source = load_model(
                model,
                precision,
                role="trainer",
                trainable=True,
                param_dtype=DTYPES[trainer.master_dtype],
                device=self.device,
                seed=self.seed,
            )
        else:
            self.model, self.source = self._sharded_model(init_method)
        # The model holds the weights: no second copy of the source's (memory of small machines).
        self.source = dataclasses.replace(self.source, state_dict=None)
        self.model.gradient_checkpointing = trainer.gradient_checkpointing
        self._trim_hooks = (  # on CPU, freed temporaries leave the heap between the blocks
            release_between_blocks(self.model.model.layers) if self.device.type == "cpu" else []
        )
        self.layer_precision = layer_precision(model, precision, role="trainer", trainable=True)
        self.receivers = {
            role: layer_precision(model, precision, role=role, trainable=False)
            for role in ("rollout", "reference")
        }
        adam = sharding.HostAdamW if trainer.offload == "optimizer" else torch.optim.AdamW
        self.optimizer = adam(
            self.model.parameters(),
            lr=trainer.lr,
            betas=trainer.betas,
            eps=trainer.eps,
            weight_decay=trainer.weight_decay,
        )
        mini = trainer.mini_batch_size or self.batch_size
        updates_per_step = trainer.epochs_per_step * math.ceil(self.batch_size / mini)
        total = self.total_steps * updates_per_step
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

    def _sharded_model(self, init_method: str) -> tuple[Decoder, Any]:
        """Join the group, build the decoder on ``meta``, shard it, load this rank's shards."""
        spec, trainer = self.model_spec, self.spec
        mesh = sharding.init_group(
            init_method, rank=self.rank, world_size=self.world_size, device=self.device
        )
        self.sharded = True
        full, source = sharding.full_weights(
            spec,
            self.precision,
            param_dtype=DTYPES[trainer.master_dtype],
            device=self.device,  # the unsharded trainer's init device: the same numbers
            seed=self.seed,
        )
        lp = layer_precision(spec, self.precision, role="trainer", trainable=True)
        with torch.device("meta"):
            model = Decoder(source.config, lp, max_positions=spec.max_model_len)
        cast_dense(model, DTYPES[trainer.master_dtype])
        sharding.shard_decoder(model, mesh, offload=trainer.offload)
        on_host = trainer.offload == "params_and_optimizer"
        model.to_empty(device="cpu" if on_host else self.device)
        sharding.reset_buffers(model, self.device)
        sharding.load_full_weights(model, full)
        del full
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return model, source

    def handshake(self) -> Handshake:
        """Quant contract report for the driver."""
        return handshake(
            "trainer", self.precision, self.layer_precision, device=self.device, rank=self.rank
        )

    @returns_free_memory
    @torch.no_grad()
    def logprobs(self, batch: TrainBatch | TrainShard) -> Tensor:
        """Current-policy logprobs [B, R] (float32, CPU) of this rank's response tokens.

        With an FP8 KV cache this scoring pass also measures K/V amax for the next scales.
        """
        shard = self._shard(batch)
        self.model.eval()
        width = shard.batch.packed.response_ids.shape[1]
        out = []
        with self._observing_kv():
            for _, micro in shard.micro_batches(self.spec.micro_batch_size):
                with deferred_finite_checks():
                    logp, _ = self._score(micro, with_entropy=False)
                if micro is not None:
                    out.append(_pad_to(logp.cpu(), width))
        return torch.cat(out) if out else torch.zeros(0, width)

    @torch.no_grad()
    def calibrate_kv(self, batch: PackedBatch) -> None:
        """Initial FP8 KV scales from a forward over ``batch`` (a no-op without an FP8 KV cache).

        Every rank scores the same prompts; amax is all-reduced with MAX before the scales are set.
        """
        attns = self._kv_modules()
        if not attns:
            return
        for attn in attns:  # provisional unit scales: amax is observed before quantization
            attn.k_scale.fill_(1.0)
            attn.v_scale.fill_(1.0)
        with self._observing_kv():
            for start in range(0, batch.input_ids.shape[0], self.spec.micro_batch_size):
                micro = batch.select(slice(start, start + self.spec.micro_batch_size))
                self.model.score_responses(
                    *_score_args(micro.to(self.device)), temperature=1.0, with_entropy=False
                )
        self._recalibrate_kv()

    def _recalibrate_kv(self) -> None:
        """Set KV scales from the amax every rank observed (all-reduced with MAX)."""
        attns = self._kv_modules()
        if not attns:
            return
        amax = sharding.all_reduce(torch.stack([a.kv_amax for a in attns]), "max")
        for attn, seen in zip(attns, amax, strict=True):
            attn.kv_amax.copy_(seen)
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

    @returns_free_memory
    def train(self, batch: TrainBatch | TrainShard) -> dict[str, float]:
        """PPO epochs × mini-batches over this rank's shard; one optimizer step per mini-batch.

        Returns metrics reduced across ranks (the values an unsharded trainer reports, up to
        float summation order).

        Raises:
            ValueError: the batch was generated by a policy version the spec does not accept.
        """
        shard = self._shard(batch)
        lag = self.version - shard.batch.policy_version
        if lag < 0 or lag > self.algorithm.max_off_policy_steps:
            raise ValueError(
                f"rollout batch from policy version {shard.batch.policy_version}, trainer is at "
                f"{self.version}; algorithm.max_off_policy_steps="
                f"{self.algorithm.max_off_policy_steps} allows a lag of "
                f"0..{self.algorithm.max_off_policy_steps}"
            )
        self.model.train()
        sums: dict[str, float] = {}
        count = 0
        for _ in range(self.spec.epochs_per_step):
            micros = list(shard.micro_batches(self.spec.micro_batch_size))
            for m, mini in enumerate(shard.minis):
                metrics = self._update([u for k, u in micros if k == m], mini.denominator)
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        return {k: v / count for k, v in sums.items()}

    def _shard(self, batch: TrainBatch | TrainShard) -> TrainShard:
        """A whole batch as the one shard of an unsharded trainer (tests, one-rank runs)."""
        if isinstance(batch, TrainShard):
            return batch
        return shard_batch(
            batch,
            ranks=1,
            mini_batch_size=self.spec.mini_batch_size or len(batch),
            micro_batch_size=self.spec.micro_batch_size,
            loss_agg=self.algorithm.loss_agg,
        )[0]

    def _update(self, micros: list[TrainBatch | None], denominator: float) -> dict[str, float]:
        """One optimizer step over a mini-batch, accumulating micro-batch gradients.

        ``None`` micro-batches (this rank has fewer rows than another) run a zero-weight forward
        and backward so FSDP's collectives stay paired across ranks.
        """
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        real = 0
        for micro in micros:
            with deferred_finite_checks():  # one host sync per micro-batch, before the step
                metrics = self._micro_backward(micro, denominator)
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
            real += micro is not None
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # no gradients held while the engines roll out
        self.scheduler.step()
        self._invalidate_fp8()
        self._recalibrate_kv()  # next version's KV scales, from this step's scoring pass
        self.version += 1
        out = _reduce_metrics(sums, real)
        out["actor/grad_norm"] = float(sharding.full_tensor(grad_norm))
        out["actor/lr"] = self.scheduler.get_last_lr()[0]
        return out

    def _micro_backward(self, micro: TrainBatch | None, denominator: float) -> dict[str, float]:
        """Forward + backward of one micro-batch (gradients accumulate); its objective metrics.

        ``None``: a zero-weight forward and backward (no metrics), so FSDP's collectives stay
        paired with a longer rank's."""
        micro = None if micro is None else micro.to(self.device)
        logp, entropy = self._score(micro, with_entropy=True)
        if micro is None:
            (logp.sum() * 0.0 + (entropy.sum() * 0.0 if entropy is not None else 0.0)).backward()
            return {}
        loss, metrics = micro_objective(
            micro, logp, entropy, spec=self.algorithm, denominator=denominator
        )
        release_free_memory()  # the forward's freed temporaries, before the backward's
        (loss * self.world_size).backward()  # FSDP averages over ranks; the loss is global
        release_free_memory()  # this micro-batch's activations, before the next one's
        return metrics

    def _score(
        self, micro: TrainBatch | None, *, with_entropy: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Logprobs [b, r] of the response tokens (and per-token entropy when asked).

        ``None``: a one-token dummy forward (zero-weight micro-batch of a short rank).
        """
        if micro is None:
            dummy = PackedBatch(*(t.to(self.device) for t in _DUMMY))
            return self.model.score_responses(
                *_score_args(dummy), temperature=1.0, with_entropy=with_entropy
            )
        micro = micro.to(self.device)
        logp, entropy = self.model.score_responses(
            *_score_args(micro.packed), temperature=micro.temperature, with_entropy=with_entropy
        )
        logp = logp.masked_fill(~micro.packed.response_mask, 0.0)
        if entropy is not None and self.algorithm.entropy_coef == 0:
            entropy = entropy.detach()
        return logp, entropy

    def _invalidate_fp8(self) -> None:
        for module in self.model.modules():
            if hasattr(module, "invalidate_quantized"):
                module.invalidate_quantized()

    @returns_free_memory
    def save(
        self, directory: Path, optimizer: bool = True, weights_dtype: str = "float32"
    ) -> list[str]:
        """Write this rank's shards of weights and AdamW state (``torch.distributed.checkpoint``
        under ``trainer/``) and its scheduler, version and RNG state (``trainer/rank_<r>.pt``).

        ``optimizer=False`` (``checkpoint.save_optimizer``) leaves the AdamW moments out (a
        resume restarts AdamW); ``weights_dtype`` (``checkpoint.weights_dtype``) is the stored
        dtype of the master weights (``bfloat16`` halves them; they load back into the master
        dtype).

        Collective: every rank calls it with the same directory. Returns the paths written by
        this rank, relative to ``directory``.
        """
        target = Path(directory) / DCP_DIR
        files = save_state(
            self.model,
            self.optimizer,
            target,
            rank=self.rank,
            optimizer_state=optimizer,
            weights_dtype=weights_dtype,
        )
        own = target / f"rank_{self.rank}.pt"
        torch.save(self._rank_state(), own)
        return [str(p.relative_to(directory)) for p in [*files, own]]

    @returns_free_memory
    def load(self, directory: Path) -> int:
        """Restore what ``save`` wrote, whatever the rank count then; return the policy version.

        Raises:
            FileNotFoundError: ``directory`` has no ``trainer/`` shards (an older checkpoint).
        """
        source = Path(directory) / DCP_DIR
        load_state(self.model, self.optimizer, source)
        ranks = sorted(source.glob("rank_*.pt"))
        own = source / f"rank_{self.rank}.pt"
        saved = torch.load(own if own.is_file() else ranks[0], weights_only=False)
        self.scheduler.load_state_dict(saved["scheduler"])
        self.version = int(saved["version"])
        torch.set_rng_state(saved["rng"]["torch"])
        if saved["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(saved["rng"]["cuda"])
        self._invalidate_fp8()
        return self.version

    @torch.no_grad()
    def model_weights(self) -> dict[str, Tensor]:
        """Full master weights (CPU copies, HF names, master dtype) of a one-rank trainer, for
        diagnostics that rebuild the policy elsewhere (mismatch attribution).

        Raises:
            ValueError: the trainer has several ranks (the gather would be collective).
        """
        if self.world_size > 1:
            raise ValueError("model_weights needs trainer.num_workers=1 (a collective otherwise)")
        return {
            k: sharding.full_tensor(v).detach().cpu().clone()
            for k, v in self.model.state_dict().items()
        }

    def current_version(self) -> int:
        """Optimizer steps taken (the policy version of the weights held)."""
        return self.version

    def _rank_state(self) -> dict[str, Any]:
        return {
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
            "world_size": self.world_size,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
        }

    def free_address(self) -> tuple[str, int]:
        """This node's IP and a free TCP port (rendezvous of the trainer or weight-sync group)."""
        return sharding.free_address()

    def gpu_location(self) -> tuple[str, str | None]:
        """``(Ray node id, GPU UUID or None)`` of this rank's device (transport choice)."""
        from fp8rl.workers.common import gpu_location

        return gpu_location(self.device)

    def init_transport(self, name: str, **kwargs: Any) -> None:
        """Use transport ``name`` for weight updates (rank 0 sends; ``nccl`` joins its own group)."""
        if self.rank == 0:
            self.publisher.join(name, **kwargs)

    @returns_free_memory
    @torch.no_grad()
    def publish(self, *, role: str = "rollout") -> tuple[WeightUpdate | None, Any]:
        """WeightUpdate (manifest) + transport handle of the current weights in ``role``'s layout
        (``rollout`` engines, or the ``reference`` for the initial sync).

        Collective when sharded: every rank gathers each weight; rank 0 quantizes and sends,
        the other ranks return ``(None, None)``.
        """
        receiver = self.receivers[role]
        fingerprint = self.precision.quant.fingerprint() if receiver.fp8 else None
        return self.publisher.publish(
            self.model,
            receiver=receiver,
            version=self.version,
            fingerprint=fingerprint,
            role=role,
            gather=self._gather if self.sharded else None,
        )

    def _gather(self, param: Tensor) -> Tensor | None:
        full = sharding.full_tensor(param)
        return full if self.rank == 0 else None

    def broadcast(self) -> None:
        """Send the last published payload over the NCCL group (engines receive concurrently)."""
        self.publisher.broadcast()


def needs_group(trainer: TrainerSpec) -> bool:
    """Whether the trainer runs FSDP2 (a process group): several ranks, or host-offloaded params."""
    return trainer.num_workers > 1 or trainer.offload == "params_and_optimizer"


def shard_batch(
    batch: TrainBatch,
    *,
    ranks: int,
    mini_batch_size: int,
    micro_batch_size: int,
    loss_agg: str,
) -> list[TrainShard]:
    """Split ``batch`` into one token-balanced ``TrainShard`` per rank (``plan_shards``), with
    each mini-batch's global loss denominator."""
    from fp8rl.workers.algorithms import loss_denominator
    from fp8rl.workers.trainer.batch import MiniLayout

    plan = plan_shards(
        batch.packed.lengths,
        ranks=ranks,
        mini_batch_size=mini_batch_size,
        micro_batch_size=micro_batch_size,
    )
    mask = batch.packed.response_mask
    denominators = [
        loss_denominator(mask[start : start + mini_batch_size], mode=loss_agg)
        for start in range(0, len(batch), mini_batch_size)
    ]
    shards = []
    for index, rows, micros in plan:
        idx = torch.tensor(index, dtype=torch.long)
        minis = [
            MiniLayout(rows=r, micro_batches=k, denominator=d)
            for r, k, d in zip(rows, micros, denominators, strict=True)
        ]
        shards.append(TrainShard(batch=batch.select(idx), minis=minis, index=idx))
    return shards


def _score_args(packed: PackedBatch) -> tuple[Tensor, ...]:
    return (
        packed.input_ids,
        packed.positions,
        packed.lengths,
        packed.prompt_lengths,
        packed.response_ids,
    )


_DUMMY = (
    torch.zeros(1, 2, dtype=torch.long),
    torch.arange(2)[None],
    torch.tensor([2]),
    torch.tensor([1]),
    torch.zeros(1, 1, dtype=torch.long),
    torch.ones(1, 1, dtype=torch.bool),
)
"""A one-token response: the forward of a zero-weight micro-batch."""


def _reduce_metrics(sums: dict[str, float], micro_batches: int) -> dict[str, float]:
    """Metrics of a mini-batch over all ranks: objective terms (computed with the global
    denominator) add up; the others average over every rank's real micro-batches."""
    keys = sorted(sums)
    values = torch.tensor([*(sums[k] for k in keys), float(micro_batches)], dtype=torch.float64)
    values = sharding.all_reduce(values, "sum")
    count = max(float(values[-1]), 1.0)
    return {
        k: float(v) if k in _SUMMED else float(v) / count
        for k, v in zip(keys, values[:-1], strict=True)
    }


_SUMMED = {"actor/pg_loss", "actor/kl", "actor/entropy"}
"""Objective metrics computed with the mini-batch denominator: micro-batch values add up."""


def _pad_to(x: Tensor, width: int) -> Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))
