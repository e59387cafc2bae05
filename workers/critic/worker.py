"""CriticWorker: the value model for PPO with GAE (one Ray actor = one role).

The shared decoder's backbone (initialised from the policy checkpoint, as verl and OpenRLHF do
by default) plus a scalar value head. The critic runs dense BF16 linears in every precision mode:
its outputs never feed a rollout engine, so the unified FP8 flow does not constrain it.
Values are read at the positions that predict each response token (the same hidden states the
policy scores), i.e. V(s_t) for the state just before token t.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fp8rl.protocol import AlgorithmSpec, ModelSpec, PrecisionSpec, TrainerSpec
from fp8rl.workers.algorithms import aggregate_loss, loss_denominator, value_loss
from fp8rl.workers.common import load_model, pick_device
from fp8rl.workers.model.scoring import PackedBatch, response_hidden


class CriticWorker:
    """Value model actor. Args: model/trainer/algorithm sub-specs; device; seed."""

    def __init__(
        self,
        model: ModelSpec,
        trainer: TrainerSpec,
        algorithm: AlgorithmSpec,
        *,
        device: str = "auto",
        seed: int = 0,
    ) -> None:
        self.spec, self.algorithm = trainer, algorithm
        self.device = pick_device(device)
        dense = PrecisionSpec(mode="bf16", exact=False)
        self.model, _ = load_model(
            model,
            dense,
            role="trainer",
            trainable=True,
            param_dtype=torch.float32,
            device=self.device,
            seed=seed,
        )
        self.head = nn.Linear(self.model.config.hidden_size, 1, device=self.device)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        params = [*self.model.parameters(), *self.head.parameters()]
        self.optimizer = torch.optim.AdamW(
            params,
            lr=algorithm.critic_lr,
            betas=trainer.betas,
            eps=trainer.eps,
            weight_decay=trainer.weight_decay,
        )

    def _values(self, batch: PackedBatch) -> Tensor:
        hidden = response_hidden(self.model, batch)
        values = self.head(hidden.float()).squeeze(-1)
        return values.masked_fill(~batch.response_mask, 0.0)

    @torch.no_grad()
    def values(self, batch: PackedBatch) -> Tensor:
        """V(s_t) [B, R] float32 (CPU) at each response token position, 0 on padding."""
        out, width = [], batch.response_ids.shape[1]
        for start in range(0, batch.input_ids.shape[0], self.spec.micro_batch_size):
            micro = batch.select(slice(start, start + self.spec.micro_batch_size)).to(self.device)
            v = self._values(micro).cpu()
            out.append(torch.nn.functional.pad(v, (0, width - v.shape[1])))
        return torch.cat(out)

    def train(self, batch: PackedBatch, returns: Tensor, old_values: Tensor) -> dict[str, float]:
        """One clipped value-loss update over the batch (micro-batched, token-mean)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        denominator = loss_denominator(batch.response_mask, mode="token_mean")
        total, clipfrac, count = 0.0, 0.0, 0
        for start in range(0, batch.input_ids.shape[0], self.spec.micro_batch_size):
            rows = slice(start, start + self.spec.micro_batch_size)
            micro = batch.select(rows).to(self.device)
            r = micro.response_ids.shape[1]
            values = self._values(micro)
            loss_tokens, clipped = value_loss(
                values,
                old_values[rows, :r].to(self.device),
                returns[rows, :r].to(self.device),
                value_clip=self.algorithm.value_clip,
            )
            mask = micro.response_mask.float()
            loss = 0.5 * aggregate_loss(
                loss_tokens, mask, mode="token_mean", denominator=denominator
            )
            loss.backward()
            total += float(loss.detach())
            clipfrac += float((clipped.float() * mask).sum() / mask.sum().clamp(min=1))
            count += 1
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [*self.model.parameters(), *self.head.parameters()], self.spec.grad_clip
        )
        self.optimizer.step()
        return {
            "critic/vf_loss": total,
            "critic/vf_clipfrac": clipfrac / count,
            "critic/grad_norm": float(grad_norm),
        }
