"""Recompute the float64 intermediates of the exact (batch-invariant) ops in the backward pass.

In ``precision.exact`` mode RMSNorm, SwiGLU's ``silu(gate) * up`` and attention evaluate in
float64 (``fp8rl.kernels.invariant``). Under autograd every float64 intermediate they create is
saved for the backward pass: for SmolLM2-135M and a micro-batch of 8 × 48 tokens that is ~0.7 GB
of the trainer's ~0.9 GB of saved activations (four times the BF16 tensors they come from).
``recomputed`` runs such an op under ``torch.utils.checkpoint`` instead: only its inputs (BF16
activations, the gain) are saved, and the backward recomputes the same float64 values from them
(``.double()`` of a BF16 or float32 value is exact, the ops are deterministic), so the gradients
are bitwise those of plain autograd. The op runs twice; it is elementwise or tiny next to the
FP8 GEMMs, so the step costs a few percent more CPU time.

Outside training (no grad, or inputs that need none), on the fast path, and for ops without
float64 intermediates (the Triton exact attention on CUDA: ``invariant.float64_inside``) the op
runs as is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from fp8rl.kernels.invariant import float64_inside

__all__ = ["recomputed"]


def recomputed(fn: Callable[..., Tensor], *args: Any, exact: bool, **kwargs: Any) -> Tensor:
    """``fn(*args, exact=exact, **kwargs)``; in exact mode under autograd, through
    ``torch.utils.checkpoint`` (non-reentrant) so its float64 intermediates are not kept.

    Args:
        fn: an op of ``fp8rl.kernels.invariant`` taking ``exact`` as a keyword.
        args, kwargs: its arguments (tensors among ``args`` are the checkpoint's inputs).
        exact: the op's ``exact`` flag; only exact ops create float64 intermediates.
    Returns:
        what ``fn`` returns: same values, and under autograd bitwise the same gradients.
    """
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(a, Tensor) and a.requires_grad for a in args
    )
    if not (exact and needs_grad) or not float64_inside(fn, args[0]):
        return fn(*args, exact=exact, **kwargs)
    return checkpoint(fn, *args, use_reentrant=False, exact=exact, **kwargs)
