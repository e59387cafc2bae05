"""Run-level settings: placement and resources, logging, checkpoints, evaluation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from fp8rl.protocol.base import StrictModel
from fp8rl.protocol.data_spec import DatasetSpec
from fp8rl.protocol.reward_spec import RewardFnSpec

TrackingBackend = Literal["console", "jsonl", "tensorboard", "wandb", "mlflow"]


class ResourcesSpec(StrictModel):
    """Where the workers run."""

    ray_address: str | None = None
    """Ray cluster to attach to (``auto``, ``ray://host:10001``); None: attach if one is reachable, else start a local one."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Compute device of the workers; ``auto`` = CUDA when available."""

    placement: Literal["colocated", "disaggregated"] = "colocated"
    """``colocated``: rollout, reference and trainer share devices; ``disaggregated``: each role owns its GPUs."""

    num_nodes: int = Field(default=1, ge=1)
    """Nodes the run spans."""

    gpus_per_node: int = Field(default=8, ge=1)
    """GPUs on each node of the cluster the spec declares (the placement plan's bundles)."""

    gpu_memory_gib: float = Field(default=141.0, gt=0)
    """Memory of one GPU, in GiB, that the placement plan checks its estimate against
    (H200: 141; H100/A100-80G: 80)."""

    cpus_per_worker: float = Field(default=1.0, gt=0)
    """CPU cores reserved per Ray actor on GPU clusters (CPU runs share the local cores)."""

    weight_transport: Literal["auto", "object_store", "cuda_ipc", "nccl"] = "auto"
    """How weight updates travel. ``auto``: object store on CPU, CUDA IPC when colocated on GPUs,
    NCCL broadcast when disaggregated; in memory with ``hybrid_engine``."""

    hybrid_engine: bool = False
    """Run the native rollout engine inside the trainer's process (verl's hybrid engine): no
    engine process, and each weight update is handed over in memory. Needs one native trainer
    rank, one native engine, ``weight_transport: auto`` and ``placement: colocated``; the
    phases run one after the other in that process. Saves the engine process on a small
    machine (the quickstart)."""


class WandbSpec(StrictModel):
    """Weights & Biases settings (needs the ``wandb`` extra)."""

    project: str = "fp8rl"
    """W&B project."""

    mode: Literal["online", "offline", "disabled"] = "offline"
    """``offline`` writes locally (sync later with ``wandb sync``)."""


class MLflowSpec(StrictModel):
    """MLflow settings (needs the ``mlflow`` extra)."""

    tracking_uri: str | None = None
    """Tracking server or ``file:`` store; None: ``file:<run_dir>/mlruns``."""

    experiment: str = "fp8rl"
    """Experiment name."""


class LoggingSpec(StrictModel):
    """Experiment tracking. JSONL metrics in the run directory are always written."""

    backends: list[TrackingBackend] = Field(
        default_factory=lambda: ["console", "jsonl", "tensorboard"]
    )
    """Tracking backends, several at once."""

    wandb: WandbSpec = Field(default_factory=WandbSpec)
    """W&B options."""

    mlflow: MLflowSpec = Field(default_factory=MLflowSpec)
    """MLflow options."""

    log_generations: int = Field(default=2, ge=0)
    """Sample responses logged per step (and per evaluation) as a table."""

    mismatch_attribution_every: int = Field(default=0, ge=0)
    """Every N steps (0 = off), split the FP8 rollout mismatch of the current policy into its
    ingredients (``mismatch/attrib/<ingredient>``: kl_k3 of weights / activations / kv_cache /
    kernels alone against the BF16 trainer, ``.../share``, and ``fp8_all``) on the step's first
    2 prompts. Costs 5 extra generate + score passes of them in the driver process."""

    @field_validator("backends")
    @classmethod
    def _jsonl_always(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys([*value, "jsonl"]))


class CheckpointSpec(StrictModel):
    """Checkpoints of the full training state."""

    every_n_steps: int = Field(default=0, ge=0)
    """Save every N steps (0: only at the end when ``save_final``)."""

    keep_last: int = Field(default=2, ge=1)
    """Verified checkpoints kept: the newest ``keep_last`` that pass verification, plus the newest
    verified healthy one, which is never deleted; older ones are deleted after a new one is
    complete. A checkpoint that fails verification is moved aside to
    ``step_<N>.unverified-<time>``: never counted, resumed from, overwritten or deleted."""

    save_final: bool = True
    """Save after the last step."""

    resume: str = "auto"
    """``auto``: continue from the run directory's latest checkpoint if any; ``never``; or a
    checkpoint path (a run directory, its ``checkpoints/`` or one ``step_<N>``). A value that is
    neither a keyword nor an existing path is refused by ``fp8rl validate``/``run``."""

    allow_quant_change: bool = False
    """Resume from a checkpoint whose quant fingerprint differs from this spec's."""

    save_optimizer: bool = True
    """Store AdamW's moments (2× the float32 weights: two thirds of a checkpoint). False: a
    resume restarts the moments from zero (warned); weights, schedule, RNG and data order
    are still restored."""

    weights_dtype: Literal["float32", "bfloat16"] = "float32"
    """Storage of the master weights. ``bfloat16`` halves them; a resume then continues from
    BF16-rounded master weights (not bit-identical to an uninterrupted run)."""


class EvalSpec(StrictModel):
    """Held-out evaluation during training."""

    every_n_steps: int = Field(default=0, ge=0)
    """Evaluate every N steps (0 = never) and after the last step when N > 0."""

    datasets: list[DatasetSpec] = Field(default_factory=list)
    """Evaluation sets; each is logged as ``val/<name>/acc``."""

    limit: int | None = Field(default=None, ge=1)
    """Evaluate on the first ``limit`` problems of each set."""

    n: int = Field(default=1, ge=1)
    """Samples per problem: pass@1 uses the first; mean@n averages all."""

    temperature: float = Field(default=0.0, ge=0)
    """Evaluation temperature (0 = greedy)."""

    max_tokens: int = Field(default=256, ge=1)
    """Evaluation response length."""

    rewards: dict[str, list[RewardFnSpec]] = Field(default_factory=dict)
    """Reward terms per evaluation set, keyed by its logged name (``gsm8k_test`` for
    ``…/gsm8k/test.jsonl``, ``math500_test``, ``arithmetic_L1``); sets not listed use ``reward.functions``."""
