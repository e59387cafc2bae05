"""fp8rl's typed contract: job spec, quant contract, messages and weight-update manifests.

Import-light by rule: importing this package never imports torch or ray (a test checks it), so
the CLI, the REST API and the driver can validate specs without loading the heavy stack.
"""

from fp8rl.protocol.algorithm_spec import AlgorithmSpec, KLSpec, RolloutCorrectionSpec
from fp8rl.protocol.data_spec import ArithmeticDataset, DatasetSpec, DataSpec, FileDataset
from fp8rl.protocol.job import JobSpec
from fp8rl.protocol.loading import SpecError, apply_override, load_job_spec, parse_job_spec
from fp8rl.protocol.messages import (
    Handshake,
    Prompt,
    RolloutRequest,
    RolloutResult,
    RolloutSample,
    SamplingParams,
)
from fp8rl.protocol.model_spec import ModelSpec
from fp8rl.protocol.quant import FP8_E4M3_MAX, PrecisionMode, PrecisionSpec, QuantConfig
from fp8rl.protocol.reward_spec import RemoteRewardSpec, RewardFnSpec, RewardSpec
from fp8rl.protocol.rollout_spec import NativeRollout, RolloutSpec, SGLangRollout, VLLMRollout
from fp8rl.protocol.run_spec import (
    CheckpointSpec,
    EvalSpec,
    LoggingSpec,
    ResourcesSpec,
)
from fp8rl.protocol.states import RunState
from fp8rl.protocol.trainer_spec import (
    MegatronTrainer,
    NativeTrainer,
    ReferenceSpec,
    TrainerSpec,
)
from fp8rl.protocol.weights import TensorEntry, WeightUpdate

__all__ = [
    "FP8_E4M3_MAX",
    "AlgorithmSpec",
    "ArithmeticDataset",
    "CheckpointSpec",
    "DataSpec",
    "DatasetSpec",
    "EvalSpec",
    "FileDataset",
    "Handshake",
    "JobSpec",
    "KLSpec",
    "LoggingSpec",
    "MegatronTrainer",
    "ModelSpec",
    "NativeRollout",
    "NativeTrainer",
    "PrecisionMode",
    "PrecisionSpec",
    "Prompt",
    "QuantConfig",
    "ReferenceSpec",
    "RemoteRewardSpec",
    "ResourcesSpec",
    "RewardFnSpec",
    "RewardSpec",
    "RolloutCorrectionSpec",
    "RolloutRequest",
    "RolloutResult",
    "RolloutSample",
    "RolloutSpec",
    "RunState",
    "SGLangRollout",
    "SamplingParams",
    "SpecError",
    "TensorEntry",
    "TrainerSpec",
    "VLLMRollout",
    "WeightUpdate",
    "apply_override",
    "load_job_spec",
    "parse_job_spec",
]
