"""MegatronTrainer: one trainer rank of ``trainer.backend=megatron`` (one Ray actor per rank).

Each rank joins the process group, builds Megatron's TP/PP/DP groups (``parallel.py``), builds
its GPTModel shard with fp8rl's FP8 linears (``model.py``) from the same weights the native
trainer loads, and trains with the native RL objective (``workers.algorithms.rl_objective``) and
AdamW on float32 masters. Micro-batches go through Megatron's ``get_forward_backward_func`` on
CUDA (the pipeline schedule for PP > 1); on CPU, where Megatron's schedules allocate CUDA tensors,
PP must be 1 and the same forward-step/loss functions run in a plain loop.

Gradient reduction (what Megatron's DDP wrapper would do, done explicitly on plain tensors):
sequence-parallel norm weights all-reduced over TP, tied embeddings over the embedding group
(first and last stage), everything summed over DP (the loss denominator is the DP-global one).
The gradient norm counts TP-replicated parameters once and is all-reduced over TP × PP.

Data parallelism: the driver sends each rank its DP replica's ``TrainShard`` (global loss
denominators); metrics are reduced over DP as the native trainer reduces them over its ranks.
Checkpoints: ``megatron.checkpoint`` (DCP, the native format; weights reload at any layout).

Not supported (refused with a message): an FP8 KV cache, PP > 1 or sequence parallel without
CUDA, a plain ``TrainBatch`` with DP > 1. AdamW state reloads only at the same TP × PP.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from torch import Tensor

from fp8rl.kernels.finite import deferred_finite_checks
from fp8rl.kernels.invariant import attention_mask
from fp8rl.protocol import AlgorithmSpec, Handshake, ModelSpec, PrecisionSpec, WeightUpdate
from fp8rl.protocol.trainer_spec import MegatronTrainer as MegatronTrainerSpec
from fp8rl.workers.algorithms import entropy_from_logits
from fp8rl.workers.common import handshake, load_model, pick_device
from fp8rl.workers.model.build import layer_precision
from fp8rl.workers.trainer.backend import TrainerBackend
from fp8rl.workers.trainer.batch import TrainBatch, TrainShard, micro_objective
from fp8rl.workers.trainer.megatron.logprobs import response_logits, vocab_parallel_logprobs
from fp8rl.workers.trainer.megatron.model import build_gpt_model, load_hf_weights
from fp8rl.workers.trainer.megatron.parallel import init_parallel
from fp8rl.workers.trainer.megatron.publish import megatron_update
from fp8rl.workers.trainer.schedule import lr_factor
from fp8rl.workers.weight_sync.transport import make_transport

_SUMMED = {"actor/pg_loss", "actor/kl", "actor/entropy"}
"""Objective metrics computed with the mini-batch denominator: micro-batch values add up."""


class MegatronTrainer(TrainerBackend):
    """One Megatron trainer rank (see the module docstring).

    Args:
        model, trainer, algorithm, precision: sub-specs (``trainer.backend == "megatron"``).
        total_steps: RL steps of the run (LR schedule). batch_size: sequences per rollout batch.
        rank, world: this rank and ``trainer.num_workers``. address, port: rendezvous of rank 0
            (TCP store), used unless ``defer``.
        device: ``auto`` | ``cpu`` | ``cuda``. seed: initialisation seed (same on every rank).
        defer: build nothing yet; the caller then calls ``join`` on every rank at once (the Ray
            driver does, with rank 0's node address: ``services.runtime``).
    Raises:
        ValueError: another backend, a world size other than ``num_workers``, PP > 1 on CPU, or
            what ``build_gpt_model`` refuses (layout, FP8 KV cache).
    """

    def __init__(
        self,
        model: ModelSpec,
        trainer: MegatronTrainerSpec,
        algorithm: AlgorithmSpec,
        precision: PrecisionSpec,
        *,
        total_steps: int,
        batch_size: int,
        rank: int = 0,
        world: int = 1,
        address: str = "127.0.0.1",
        port: int = 29500,
        device: str = "auto",
        seed: int = 0,
        defer: bool = False,
    ) -> None:
        if trainer.backend != "megatron" or world != trainer.num_workers:
            raise ValueError(
                f"MegatronTrainer needs trainer.backend=megatron and world == num_workers; got "
                f"{trainer.backend}, world {world}, num_workers {trainer.num_workers}"
            )
        self.device = pick_device(device)
        if self.device.type != "cuda" and (
            trainer.pipeline_parallel_size > 1 or trainer.sequence_parallel
        ):
            raise ValueError(
                "trainer.pipeline_parallel_size > 1 and trainer.sequence_parallel need CUDA "
                "(Megatron's pipeline schedules and sequence-parallel collectives allocate CUDA "
                "tensors)"
            )
        self.spec, self.algorithm, self.precision, self.rank = trainer, algorithm, precision, rank
        self.model_spec, self.world, self.seed = model, world, seed
        self.total_steps, self.batch_size = total_steps, batch_size
        self.version = 0
        self.transports = {"object_store": make_transport("object_store")}
        self.transport = "object_store"
        if not defer:
            self.join(f"tcp://{address}:{port}")

    def join(self, init_method: str) -> None:
        """Join the trainer process group at ``init_method`` (``tcp://host:port`` of rank 0; every
        rank calls it at once), build Megatron's groups, this rank's model shard and AdamW.

        Raises:
            ValueError: what ``init_parallel`` and ``build_gpt_model`` refuse.
        """
        model, trainer, precision = self.model_spec, self.spec, self.precision
        self.layout = init_parallel(
            rank=self.rank,
            world=self.world,
            tp=trainer.tensor_parallel_size,
            pp=trainer.pipeline_parallel_size,
            init_method=init_method,
        )
        # The native trainer's weights, built on this rank's device: a random preset then draws
        # the same initial weights as the native trainer on that device (CPU and CUDA generators
        # differ).
        native, self.source = load_model(
            model,
            precision,
            role="trainer",
            trainable=True,
            param_dtype=torch.float32,
            device=self.device,
            seed=self.seed,
        )
        self.layer_precision = layer_precision(model, precision, role="trainer", trainable=True)
        self.model = build_gpt_model(
            self.source.config,
            self.layer_precision,
            max_positions=model.max_model_len,
            sequence_parallel=trainer.sequence_parallel,
        )
        load_hf_weights(self.model, {k: v.detach() for k, v in native.named_parameters()})
        del native
        self.source = dataclasses.replace(self.source, state_dict=None)  # the model holds them
        self.model.to(self.device)
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
        # One optimizer step per (global) mini-batch, as the native trainer counts them.
        mini = trainer.mini_batch_size or self.batch_size
        total = self.total_steps * trainer.epochs_per_step * math.ceil(self.batch_size / mini)
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

    # ---- scoring -----------------------------------------------------------------------------

    def handshake(self) -> Handshake:
        """Quant contract report (the same fields as the native trainer's)."""
        return handshake(
            "trainer", self.precision, self.layer_precision, device=self.device, rank=self.rank
        )

    def _score(
        self, micro: TrainBatch, *, with_entropy: bool, hidden: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Logprobs [b, r] of the response tokens (and entropy when asked) on the last stage;
        ``hidden``: final hidden states from the schedule (None: run the single-stage model)."""
        logits = response_logits(self.model, micro.packed, hidden)
        config, exact = self.model.fp8rl_config, self.layer_precision.exact
        logp = vocab_parallel_logprobs(
            logits,
            micro.packed.response_ids,
            vocab=config.vocab_size,
            temperature=micro.temperature,
            exact=exact,
        ).masked_fill(~micro.packed.response_mask, 0.0)
        entropy = None
        if with_entropy:
            entropy = self._entropy(logits, micro.temperature)
            if self.algorithm.entropy_coef == 0:
                entropy = entropy.detach()
        return logp, entropy

    def _entropy(self, logits: Tensor, temperature: float) -> Tensor:
        vocab = self.model.fp8rl_config.vocab_size
        if parallel_state.get_tensor_model_parallel_world_size() == 1:  # the native formula
            logits = logits[..., :vocab]
            return entropy_from_logits(logits if temperature <= 0 else logits.float() / temperature)
        from fp8rl.workers.trainer.megatron.logprobs import vocab_parallel_entropy

        return vocab_parallel_entropy(
            logits, vocab=vocab, temperature=temperature, exact=self.layer_precision.exact
        )

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch | TrainShard) -> Tensor | None:
        """Current-policy logprobs [B, R] (float32, CPU) of this rank's rows (a driver
        ``TrainShard``: its rows, in its order; every rank of a DP replica gets the same shard).

        With PP > 1 only the last pipeline stage has them (Megatron's forward-only schedule);
        the other stages return None.
        """
        batch = self._shard(batch).batch
        self.model.eval()
        width = batch.packed.response_ids.shape[1]
        micros = [
            batch.select(slice(s, s + self.spec.micro_batch_size)).to(self.device)
            for s in range(0, len(batch), self.spec.micro_batch_size)
        ]
        out: list[Tensor] = []

        def keep(micro: TrainBatch, hidden: Tensor | None = None) -> Tensor:
            logp, _ = self._score(micro, with_entropy=False, hidden=hidden)
            out.append(torch.nn.functional.pad(logp.float().cpu(), (0, width - logp.shape[1])))
            return logp.sum() * 0.0

        with deferred_finite_checks():
            if self.layout.pp > 1:
                self._megatron_schedule(micros, keep, forward_only=True)
            else:
                for micro in micros:
                    keep(micro)
        if self.layout.pp > 1 and not parallel_state.is_pipeline_last_stage():
            return None
        return torch.cat(out)

    def calibrate_kv(self, batch: Any) -> None:
        """No FP8 KV cache with this backend (``build_gpt_model`` refuses it): nothing to do."""

    # ---- training ----------------------------------------------------------------------------

    def train(self, batch: TrainBatch | TrainShard) -> dict[str, float]:
        """PPO epochs × mini-batches over this rank's shard (the driver's ``TrainShard``: rows of
        this DP replica, global loss denominators); one optimizer step per mini-batch.

        Returns metrics reduced over DP (the values a one-rank trainer reports, up to summation
        order). Raises ``ValueError``: the batch's policy version lags more than allowed.
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
        micros = list(shard.micro_batches(self.spec.micro_batch_size))
        sums: dict[str, float] = {}
        count = 0
        for _ in range(self.spec.epochs_per_step):
            for m, mini in enumerate(shard.minis):
                # Empty micro-batches (None) pad FSDP's collectives in the native trainer; here no
                # collective spans DP replicas before the gradient all-reduce: skip them.
                real = [u for k, u in micros if k == m and u is not None]
                for k, v in self._update(real, mini.denominator).items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        return {k: v / count for k, v in sums.items()}

    def _shard(self, batch: TrainBatch | TrainShard) -> TrainShard:
        """The driver's shard, or a whole batch as the one shard of a single DP replica.

        Raises ``ValueError`` for a plain batch when DP > 1 (the driver shards over DP)."""
        if isinstance(batch, TrainShard):
            return batch
        if self.layout.dp > 1:
            raise ValueError(
                f"with {self.layout.dp} data-parallel replicas, train/logprobs take the driver's "
                "TrainShard of this replica (services.step_batch.trainer_shards)"
            )
        from fp8rl.workers.trainer.worker import shard_batch

        return shard_batch(
            batch,
            ranks=1,
            mini_batch_size=self.spec.mini_batch_size or len(batch),
            micro_batch_size=self.spec.micro_batch_size,
            loss_agg=self.algorithm.loss_agg,
        )[0]

    def _update(self, micros: list[TrainBatch], denominator: float) -> dict[str, float]:
        """One optimizer step over this replica's micro-batches of a mini-batch (gradients
        accumulated, then reduced over TP/PP/DP); ``denominator``: the global loss denominator."""
        self.optimizer.zero_grad(set_to_none=True)
        micros = [m.to(self.device) for m in micros]
        with deferred_finite_checks():  # one host sync for the mini-batch, before the step
            sums = self._forward_backward(micros, denominator)
        self._reduce_grads()
        grad_norm = self._clip_grads(self.spec.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        for module in self.model.modules():
            if hasattr(module, "invalidate_quantized"):
                module.invalidate_quantized()
        self.version += 1
        out = self._dp_reduce(sums, len(micros))
        out["actor/grad_norm"] = grad_norm
        out["actor/lr"] = self.scheduler.get_last_lr()[0]
        return out

    def _forward_backward(self, micros: list[TrainBatch], denominator: float) -> dict[str, float]:
        """Loss and backward of every micro-batch; summed objective metrics."""
        sums: dict[str, float] = {}

        def loss_of(micro: TrainBatch, hidden: Tensor | None = None) -> Tensor:
            logp, entropy = self._score(micro, with_entropy=True, hidden=hidden)
            loss, metrics = micro_objective(
                micro, logp, entropy, spec=self.algorithm, denominator=denominator
            )
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
            return loss

        if self.device.type == "cuda":
            self._megatron_schedule(micros, loss_of)
        else:  # PP = 1 (checked in __init__): the no-pipelining schedule, without CUDA tensors
            for micro in micros:
                loss_of(micro).backward()
        return sums

    def _megatron_schedule(
        self, micros: list[TrainBatch], loss_of, *, forward_only: bool = False
    ) -> None:
        """Megatron's schedule (no pipelining, or 1F1B for PP > 1) over the micro-batches.

        ``loss_of(micro, hidden)``: the scalar loss from the last stage's hidden states. Every
        micro-batch is right-padded to one length (pipeline stages exchange fixed-shape
        activations). CUDA only (megatron-core 0.16.1); PP = 1 ran on the H200
        (benchmarks/results/megatron-h200.md), PP > 1 needs several GPUs and has not run.
        """
        from megatron.core.pipeline_parallel import get_forward_backward_func

        n, length = len(micros), max(m.packed.input_ids.shape[1] for m in micros)
        if self.layout.pp > 1 and len({len(m) for m in micros}) > 1:
            raise ValueError(
                "with pipeline_parallel_size > 1 every micro-batch needs micro_batch_size rows"
            )

        def forward_step(iterator, model):
            micro = next(iterator)
            ids = torch.nn.functional.pad(
                micro.packed.input_ids, (0, length - micro.packed.input_ids.shape[1])
            )
            positions = torch.arange(length, device=ids.device).expand_as(ids)
            mask = attention_mask(positions, micro.packed.lengths, length)
            output = model(ids, positions, mask)

            def loss_func(hidden: Tensor):
                # The objective is normalised by the mini-batch denominator already; Megatron
                # divides a 2-tuple loss by the number of micro-batches, so undo that.
                return loss_of(micro, hidden) * n, {}

            return output, loss_func

        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micros),
            model=[self.model],
            num_microbatches=n,
            seq_length=length,
            micro_batch_size=self.spec.micro_batch_size,
            forward_only=forward_only,
        )

    def _reduce_grads(self) -> None:
        """Sequence-parallel norms over TP, tied embeddings over the embedding group, all over DP."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        tp_group = parallel_state.get_tensor_model_parallel_group()
        if self.spec.sequence_parallel:
            for p in params:
                if getattr(p, "sequence_parallel", False):
                    dist.all_reduce(p.grad, group=tp_group)
        tied = self.layout.pp > 1 and self.model.share_embeddings_and_output_weights
        if tied and parallel_state.is_rank_in_embedding_group():
            weight = self.model.shared_embedding_or_output_weight()
            dist.all_reduce(weight.grad, group=parallel_state.get_embedding_group())
        if self.layout.dp > 1:
            dp_group = parallel_state.get_data_parallel_group()
            for p in params:
                dist.all_reduce(p.grad, group=dp_group)

    def _clip_grads(self, max_norm: float) -> float:
        """Clip to the global gradient norm (TP-duplicated and tied copies counted once)."""
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        tied_copy = (
            None
            if self.model.pre_process or not self.model.share_embeddings_and_output_weights
            else self.model.output_layer.weight
        )
        squares = torch.zeros((), dtype=torch.float64, device=self.device)
        grads = []
        for p in self.model.parameters():
            if p.grad is None:
                continue
            grads.append(p.grad)
            duplicate = not getattr(p, "tensor_model_parallel", False) and tp_rank > 0
            if not duplicate and p is not tied_copy:
                squares += p.grad.double().pow(2).sum()
        if self.layout.tp * self.layout.pp > 1:
            dist.all_reduce(squares, group=parallel_state.get_model_parallel_group())
        norm = float(squares.sqrt())
        factor = max_norm / (norm + 1e-6)
        if factor < 1:
            for g in grads:
                g.mul_(factor)
        return norm

    def _dp_reduce(self, sums: dict[str, float], micro_batches: int) -> dict[str, float]:
        """Metrics of a mini-batch over every DP replica: objective terms (computed with the
        global denominator) add up; the others average over all real micro-batches."""
        keys = sorted(sums)
        values = torch.tensor(
            [*(sums[k] for k in keys), float(micro_batches)],
            dtype=torch.float64,
            device=self.device,
        )
        if self.layout.dp > 1:
            dist.all_reduce(values, group=parallel_state.get_data_parallel_group())
        values = values.cpu()
        count = max(float(values[-1]), 1.0)
        return {
            k: float(v) if k in _SUMMED else float(v) / count
            for k, v in zip(keys, values[:-1], strict=True)
        }

    # ---- weights -----------------------------------------------------------------------------

    def init_transport(self, name: str, **kwargs: Any) -> None:
        """Use transport ``name`` for weight updates (rank 0 sends)."""
        self.transports[name] = make_transport(name, **kwargs)
        self.transport = name

    @torch.no_grad()
    def publish(self, *, role: str = "rollout") -> tuple[WeightUpdate, Any]:
        """The native trainer's WeightUpdate of the current weights (collective; rank 0 sends
        the payload and returns its handle, the other ranks return ``(update, None)``)."""
        receiver = self.receivers[role]
        fingerprint = self.precision.quant.fingerprint() if receiver.fp8 else None
        transport = self.transports[self.transport if role == "rollout" else "object_store"]
        update, payload = megatron_update(
            self.model,
            receiver=receiver,
            version=self.version,
            fingerprint=fingerprint,
            transport=transport.name,
        )
        if self.rank != 0:
            return update, None
        if transport.name == "nccl":  # receivers need the manifest first; ``broadcast`` sends
            self._pending = payload
            return update, None
        return update, transport.send(payload)

    def broadcast(self) -> None:
        """Send the last published payload over the NCCL weight-sync group (rank 0)."""
        payload, self._pending = self._pending, None
        self.transports["nccl"].send(payload)

    def free_address(self) -> tuple[str, int]:
        """This node's IP and a free TCP port (rendezvous of the NCCL weight-broadcast group)."""
        from fp8rl.workers.trainer.sharding import free_address

        return free_address()

    def state_dict(self) -> dict[str, Any]:
        """The native trainer's checkpoint layout (``TrainerWorker.state_dict``): the whole model
        as float32 masters in HF names (gathered over TP and PP: collective), plus this rank's
        AdamW, scheduler, version and RNG."""
        from fp8rl.workers.trainer.megatron.checkpoint import hf_masters

        return {
            "model": hf_masters(self.model),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
            "rng": {"torch": torch.get_rng_state(), "cuda": []},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` (HF-named weights resharded to this rank's layout; the
        optimizer state must come from the same layout)."""
        load_hf_weights(self.model, state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])
        torch.set_rng_state(state["rng"]["torch"])

    def current_version(self) -> int:
        """Optimizer steps taken (the policy version of the weights held)."""
        return self.version

    def save(
        self, directory: Path, optimizer: bool = True, weights_dtype: str = "float32"
    ) -> list[str]:
        """Write the native checkpoint format (``torch.distributed.checkpoint`` under
        ``trainer/``: HF-named masters + per-shard AdamW, and ``trainer/rank_<r>.pt``; see
        ``megatron.checkpoint``). Collective: every rank, same directory.

        ``optimizer=False`` (``checkpoint.save_optimizer``) leaves the AdamW state out;
        ``weights_dtype`` (``checkpoint.weights_dtype``) is the stored dtype of the weights.
        Returns the paths this rank wrote, relative to ``directory``.
        """
        from fp8rl.workers.trainer.megatron import checkpoint

        return checkpoint.save(
            self, Path(directory), optimizer=optimizer, weights_dtype=weights_dtype
        )

    def load(self, directory: Path) -> int:
        """Restore ``save``'s state (weights at any TP × PP × DP, AdamW at the same TP × PP);
        returns the policy version. Collective.

        Raises:
            FileNotFoundError: no ``trainer/.metadata`` in ``directory``.
        """
        from fp8rl.workers.trainer.megatron import checkpoint

        return checkpoint.load(self, Path(directory))
