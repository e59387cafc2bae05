"""Reward worker and reward functions (rule-based, math-verify, custom by dotted path, remote RM)."""

from fp8rl.workers.reward.functions import BUILTIN_FUNCTIONS, resolve_reward_fn
from fp8rl.workers.reward.worker import RewardWorker

__all__ = ["BUILTIN_FUNCTIONS", "RewardWorker", "resolve_reward_fn"]
