"""Trainer and reference settings; the trainer backend is a discriminated union."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fp8rl.protocol.base import StrictModel, tagged_union


class _TrainerCommon(StrictModel):
    lr: float = Field(default=1e-6, gt=0)
    """Peak learning rate of AdamW."""

    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW decoupled weight decay."""

    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""

    eps: float = Field(default=1e-8, gt=0)
    """AdamW epsilon."""

    warmup_steps: int = Field(default=0, ge=0)
    """Optimizer steps of linear warmup from 0 to ``lr``."""

    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Decay after warmup, down to ``min_lr_ratio * lr`` at the last step."""

    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Final learning rate as a fraction of ``lr`` (cosine and linear schedules)."""

    grad_clip: float = Field(default=1.0, gt=0)
    """Clip the global gradient norm to this value."""

    mini_batch_size: int | None = Field(default=None, ge=1)
    """Sequences per optimizer step (None: the whole rollout batch, one update per step)."""

    micro_batch_size: int = Field(default=8, ge=1)
    """Sequences per forward/backward; gradients accumulate over a mini-batch."""

    epochs_per_step: int = Field(default=1, ge=1)
    """Passes over each rollout batch (PPO epochs)."""

    master_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of master weights and optimizer state."""

    gradient_checkpointing: bool = False
    """Recompute decoder blocks in backward to save activation memory."""

    num_workers: int = Field(default=1, ge=1)
    """Trainer actors (data parallel ranks)."""

    gpus_per_worker: int = Field(default=0, ge=0)
    """GPUs each trainer actor holds (0 on CPU)."""

    offload: Literal["none", "optimizer", "params_and_optimizer"] = "none"
    """CPU offload of the sharded training state (FSDP2 ``CPUOffloadPolicy``): ``optimizer`` keeps
    AdamW state (and the optimizer step) on the host; ``params_and_optimizer`` also keeps the
    master weights there between uses. Lets fewer GPUs than the state needs still train."""

    @model_validator(mode="after")
    def _micro_divides_mini(self) -> _TrainerCommon:
        if self.mini_batch_size is not None and self.mini_batch_size % self.micro_batch_size:
            raise ValueError(
                f"mini_batch_size ({self.mini_batch_size}) must be a multiple of "
                f"micro_batch_size ({self.micro_batch_size})"
            )
        return self


class NativeTrainer(_TrainerCommon):
    """Plain PyTorch trainer on the shared decoder (data parallel across actors)."""

    backend: Literal["native"] = "native"
    """Discriminator: native torch."""


class MegatronTrainer(_TrainerCommon):
    """Megatron-core trainer for tensor/pipeline parallel training (fp8rl's FP8 linears inside
    Megatron's parallel layers).

    Rank layout: ``num_workers`` = TP × PP × DP trainer actors (one per rank, one GPU each on a
    GPU cluster); ``DP = num_workers / (tensor_parallel_size × pipeline_parallel_size)``. Ranks are
    ordered TP fastest, then DP, then PP (Megatron's ``tp-dp-pp`` order), so a TP group is
    ``tensor_parallel_size`` consecutive ranks (one node when it fits).
    """

    backend: Literal["megatron"] = "megatron"
    """Discriminator: Megatron-core."""

    tensor_parallel_size: int = Field(default=1, ge=1)
    """Megatron tensor-parallel size (must divide the attention and KV heads)."""

    pipeline_parallel_size: int = Field(default=1, ge=1)
    """Megatron pipeline-parallel size (must divide the decoder layers)."""

    sequence_parallel: bool = False
    """Megatron sequence parallelism (norms and dropout on sequence shards); needs
    ``tensor_parallel_size > 1``."""

    @model_validator(mode="after")
    def _check_layout(self) -> MegatronTrainer:
        model_parallel = self.tensor_parallel_size * self.pipeline_parallel_size
        if self.num_workers % model_parallel:
            raise ValueError(
                f"num_workers ({self.num_workers}) must be a multiple of tensor_parallel_size × "
                f"pipeline_parallel_size ({self.tensor_parallel_size} × "
                f"{self.pipeline_parallel_size} = {model_parallel}); num_workers = TP × PP × DP"
            )
        if self.sequence_parallel and self.tensor_parallel_size == 1:
            raise ValueError("sequence_parallel needs tensor_parallel_size > 1")
        return self

    @property
    def data_parallel_size(self) -> int:
        """DP = num_workers / (TP × PP)."""
        return self.num_workers // (self.tensor_parallel_size * self.pipeline_parallel_size)


TrainerSpec = tagged_union("backend", "native", NativeTrainer, MegatronTrainer)


class ReferenceSpec(StrictModel):
    """The frozen initial policy used for the KL term."""

    enabled: bool | None = None
    """Run a reference worker. None: only when a KL coefficient is non-zero."""

    num_workers: int = Field(default=1, ge=1)
    """Reference actors."""

    gpus_per_worker: int = Field(default=0, ge=0)
    """GPUs each reference actor holds (0 on CPU)."""
