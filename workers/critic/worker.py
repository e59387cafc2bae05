"""CriticWorker: the value model for PPO with GAE (one Ray actor = one data-parallel rank).

The shared decoder's backbone (initialised from the policy checkpoint, as verl and OpenRLHF do
by default) plus a scalar value head. The critic runs dense linears in every precision mode: its
outputs never feed a rollout engine, so the unified FP8 flow does not constrain it. Values are
read at the positions that predict each response token (the same hidden states the policy
scores), i.e. V(s_t) for the state just before token t.

With ``trainer.num_workers = N > 1`` (or ``trainer.offload=params_and_optimizer``) the N critic
actors form their own torch.distributed group and shard the value model with FSDP2 exactly like
the policy trainer (``workers/trainer/sharding.py``): rank i scores and trains on the driver's
token-balanced ``TrainShard`` i with the whole batch's token count as the loss denominator.
``save``/``load`` write and read rank shards under ``critic/`` of a checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from fp8rl.protocol import AlgorithmSpec, ModelSpec, PrecisionSpec, TrainerSpec
from fp8rl.workers.algorithms import aggregate_loss, value_loss
from fp8rl.workers.common import load_model, pick_device
from fp8rl.workers.model.build import cast_dense, layer_precision
from fp8rl.workers.model.decoder import Decoder
from fp8rl.workers.model.scoring import PackedBatch, response_hidden
from fp8rl.workers.trainer import sharding
from fp8rl.workers.trainer.batch import TrainBatch, TrainShard
from fp8rl.workers.trainer.dcp_state import load_state, save_state
from fp8rl.workers.trainer.worker import _DUMMY, needs_group, shard_batch

CRITIC_DIR = "critic"
"""Sub-directory of a checkpoint holding the critic's shards."""

DENSE = PrecisionSpec(mode="bf16", exact=False)
"""The critic's precision: dense linears (its values never reach an engine)."""


class ValueModel(nn.Module):
    """Decoder backbone + a zero-initialised scalar head. Args: the decoder (its lm_head is
    dropped)."""

    def __init__(self, decoder: Decoder) -> None:
        super().__init__()
        decoder.lm_head = nn.Identity()  # never used: no vocabulary-sized weight and AdamW state
        self.decoder = decoder
        self.head = nn.Linear(decoder.config.hidden_size, 1)

    def forward(self, batch: PackedBatch) -> Tensor:
        """V(s_t) [B, R] float32 at each response token, 0 where ``response_mask`` is False."""
        hidden = response_hidden(self.decoder, batch)
        values = self.head(hidden.float()).squeeze(-1)
        return values.masked_fill(~batch.response_mask, 0.0)


class CriticWorker:
    """Value model rank. Args: model/trainer/algorithm sub-specs; device; seed; rank and
    world_size of the critic group (sharded critics wait for ``join``, like trainer ranks)."""

    def __init__(
        self,
        model: ModelSpec,
        trainer: TrainerSpec,
        algorithm: AlgorithmSpec,
        *,
        device: str = "auto",
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.model_spec, self.spec, self.algorithm = model, trainer, algorithm
        self.device, self.seed = pick_device(device), seed
        self.rank, self.world_size = rank, world_size
        if not needs_group(trainer):
            self.join(None)

    def join(self, init_method: str | None) -> None:
        """Build the value model and AdamW; with ``init_method`` (``tcp://host:port`` of the
        critic group), join the group and shard with FSDP2."""
        torch.manual_seed(self.seed)
        if init_method is None:
            decoder = load_model(
                self.model_spec,
                DENSE,
                role="trainer",
                trainable=True,
                param_dtype=torch.float32,
                device=self.device,
                seed=self.seed,
            )[0]
            self.model = ValueModel(decoder).to(self.device)
        else:
            self.model = self._sharded_model(init_method)
        with torch.no_grad():
            for p in self.model.head.parameters():
                sharding.local(p).zero_()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=self.algorithm.critic_lr,
            betas=self.spec.betas,
            eps=self.spec.eps,
            weight_decay=self.spec.weight_decay,
        )

    def _sharded_model(self, init_method: str) -> ValueModel:
        spec = self.model_spec
        mesh = sharding.init_group(
            init_method, rank=self.rank, world_size=self.world_size, device=self.device
        )
        full, source = sharding.full_weights(
            spec, DENSE, param_dtype=torch.float32, device=self.device, seed=self.seed
        )
        lp = layer_precision(spec, DENSE, role="trainer", trainable=True)
        with torch.device("meta"):
            model = ValueModel(Decoder(source.config, lp, max_positions=spec.max_model_len))
        cast_dense(model.decoder, torch.float32)
        sharding.shard_decoder(model.decoder, mesh, offload=self.spec.offload, root=model)
        on_host = self.spec.offload == "params_and_optimizer"
        model.to_empty(device="cpu" if on_host else self.device)
        sharding.reset_buffers(model.decoder, self.device)
        full.pop("lm_head.weight", None)
        sharding.load_full_weights(model.decoder, full)
        return model

    def free_address(self) -> tuple[str, int]:
        """This node's IP and a free TCP port (rendezvous of the critic group)."""
        return sharding.free_address()

    def _micro_values(self, micro: TrainBatch | None) -> Tensor:
        if micro is None:  # a short rank's zero-weight forward: FSDP's collectives stay paired
            return self.model(PackedBatch(*(t.to(self.device) for t in _DUMMY)))
        return self.model(micro.packed.to(self.device))

    @torch.no_grad()
    def values(self, shard: TrainShard | PackedBatch) -> Tensor:
        """V(s_t) [rows, R] float32 (CPU) of this rank's rows, 0 on padding.

        ``shard``: this rank's ``TrainShard`` (``critic_shards``), or a whole ``PackedBatch`` on
        an unsharded critic."""
        shard = self._shard(shard)
        width = shard.batch.packed.response_ids.shape[1]
        out = []
        for _, micro in shard.micro_batches(self.spec.micro_batch_size):
            v = self._micro_values(micro)
            if micro is not None:
                out.append(torch.nn.functional.pad(v.cpu(), (0, width - v.shape[1])))
        return torch.cat(out) if out else torch.zeros(0, width)

    def train(
        self, shard: TrainShard | PackedBatch, returns: Tensor, old_values: Tensor
    ) -> dict[str, float]:
        """One clipped value-loss update over this rank's rows (micro-batched, token-mean over
        the whole batch's response tokens). ``returns``, ``old_values``: [rows, R] float32 in
        the shard's row order. Metrics are reduced over the critic ranks."""
        shard = self._shard(shard)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        mini = shard.minis[0]
        sums, start = torch.zeros(3, dtype=torch.float64), 0  # vf_loss, clipfrac, micro count
        for _, micro in shard.micro_batches(self.spec.micro_batch_size):
            values = self._micro_values(micro)
            if micro is None:
                (values.sum() * 0.0).backward()
                continue
            rows, r = slice(start, start + len(micro)), values.shape[1]
            start += len(micro)
            loss_tokens, clipped = value_loss(
                values,
                old_values[rows, :r].to(self.device),
                returns[rows, :r].to(self.device),
                value_clip=self.algorithm.value_clip,
            )
            mask = micro.packed.response_mask.to(self.device).float()
            loss = 0.5 * aggregate_loss(
                loss_tokens, mask, mode="token_mean", denominator=mini.denominator
            )
            (loss * self.world_size).backward()  # FSDP averages over ranks; the loss is global
            clip = float((clipped.float() * mask).sum() / mask.sum().clamp(min=1))
            sums += torch.tensor([float(loss.detach()), clip, 1.0], dtype=torch.float64)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        sums = sharding.all_reduce(sums, "sum")
        return {
            "critic/vf_loss": float(sums[0]),
            "critic/vf_clipfrac": float(sums[1] / sums[2].clamp(min=1)),
            "critic/grad_norm": float(sharding.full_tensor(grad_norm)),
        }

    def _shard(self, batch: TrainShard | PackedBatch) -> TrainShard:
        """A whole batch as the one shard of an unsharded critic."""
        if isinstance(batch, TrainShard):
            return batch
        return critic_shards(
            _as_train_batch(batch), ranks=1, micro_batch_size=self.spec.micro_batch_size
        )[0]

    def save(
        self, directory: Path, optimizer: bool = True, weights_dtype: str = "float32"
    ) -> list[str]:
        """Write this rank's shards of the value model and its AdamW state under ``critic/``
        (collective over the critic ranks); the paths written, relative to ``directory``."""
        files = save_state(
            self.model,
            self.optimizer,
            Path(directory) / CRITIC_DIR,
            rank=self.rank,
            optimizer_state=optimizer,
            weights_dtype=weights_dtype,
        )
        return [str(p.relative_to(directory)) for p in files]

    def load(self, directory: Path) -> None:
        """Restore what ``save`` wrote (any critic rank count then).

        Raises:
            FileNotFoundError: the checkpoint has no ``critic/`` (saved by a run without GAE).
        """
        load_state(self.model, self.optimizer, Path(directory) / CRITIC_DIR)


def critic_shards(batch: TrainBatch, *, ranks: int, micro_batch_size: int) -> list[TrainShard]:
    """One token-balanced shard per critic rank: a single mini-batch (one value update per step)
    whose loss denominator is the batch's response-token count (token-mean)."""
    return shard_batch(
        batch,
        ranks=ranks,
        mini_batch_size=len(batch),
        micro_batch_size=micro_batch_size,
        loss_agg="token_mean",
    )


def _as_train_batch(packed: PackedBatch) -> TrainBatch:
    zeros = torch.zeros(packed.response_ids.shape)
    return TrainBatch(packed, zeros, zeros, zeros, None, 0, 1.0)
