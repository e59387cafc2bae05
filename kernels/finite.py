"""The quantizers' finiteness check: NaN/inf input is an error, not a NaN scale.

Design notes
------------
* Every quantizer checks its amax grid (1/128 of the data or less) with ``raise_if_not_finite``.
  Checked at once, that is one host sync per quantization: a trainer step of an 8-layer model
  runs a few hundred, and each leaves the GPU idle while Python launches the next kernel.
* ``deferred_finite_checks()`` turns each check into one asynchronous device reduction (the
  float64 sum of the amax grid: finite exactly when every group is, since amax ≥ 0 and float64
  cannot overflow on float32/bfloat16 amaxes) and raises at the block's end, after one sync for
  all of them. The trainers wrap each micro-batch's forward + backward in it, so a bad
  micro-batch is still refused before the optimizer step. The message names the first bad
  quantization but not the group (keeping every amax grid until the end would cost memory;
  reproduce outside the block for the index). One kernel per check, not more: in eager code
  at small sizes the CPU launch cost is what limits the step (the H200 measurements of
  ``benchmarks/kernels.py``).
* The deferral is process-wide, not a ``ContextVar``: autograd runs CUDA backward functions in
  its own device threads, where a context variable of the calling thread is not visible.
  One thread drives a worker's model at a time (a Ray actor runs one call at a time).
* Inside CUDA-graph capture no check runs (``should_check_finite``): it would sync.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

_pending: list[tuple[Tensor, tuple[int, ...], str, str]] | None = None
"""Queued checks of the innermost ``deferred_finite_checks`` block: (float64 sum of the amax
grid on its device, grid shape, name, what). The sum is finite exactly when every group is."""


def should_check_finite(check_finite: bool, device: torch.device) -> bool:
    """Whether to run the finiteness check (never inside a CUDA graph capture: it syncs)."""
    if not check_finite:
        return False
    return not (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def raise_if_not_finite(amax: Tensor, *, name: str, what: str) -> None:
    """Raise ``ValueError`` naming the first group whose ``amax`` is NaN/inf.

    ``amax``: the logical scale grid (any shape, any float dtype); ``what`` says what one grid
    index addresses. Immediate: one ``isfinite`` reduction and one host sync on CUDA. Inside
    ``deferred_finite_checks()``: queued on the device, raised at the block's end.
    """
    if amax.numel() == 0:
        return
    if _pending is not None:
        _pending.append((amax.detach().sum(dtype=torch.float64), tuple(amax.shape), name, what))
        return
    finite = torch.isfinite(amax)
    if bool(finite.all()):
        return
    bad = (~finite).nonzero()
    first = tuple(int(i) for i in bad[0].tolist())
    raise ValueError(
        f"{name}: non-finite input ({float(amax[first])}) in {what} at scale index {first}; "
        f"{bad.shape[0]} of {amax.numel()} groups are NaN/inf. FP8 scales would be NaN: "
        "fix the upstream overflow instead of quantizing it"
    )


@contextmanager
def deferred_finite_checks() -> Iterator[None]:
    """Defer the finiteness checks of every quantization in the block to its end (one sync).

    Use around a forward + backward whose result is not consumed before the block ends (a
    trainer's micro-batch). Nested blocks check their own quantizations at their own end.

    Raises:
        ValueError: at the block's end, naming the first queued quantization that saw NaN/inf
            and what its grid addresses (not the group: see the module notes). An exception
            raised inside the block propagates unchanged and the queued checks are dropped.
    """
    global _pending
    outer, _pending = _pending, []
    try:
        yield
        queued = _pending
    finally:
        _pending = outer
    if not queued:
        return
    device = queued[0][0].device
    sums = torch.stack([total.to(device) for total, *_ in queued]).cpu()
    bad = (~torch.isfinite(sums)).nonzero()
    if bad.numel():
        _, shape, name, what = queued[int(bad[0])]
        raise ValueError(
            f"{name}: non-finite input (NaN/inf) in {what} of its {tuple(shape)} scale grid; "
            f"{bad.numel()} of {len(queued)} quantizations of the block saw NaN/inf (deferred "
            "check: the group index is not kept). FP8 scales would be NaN: fix the upstream "
            "overflow instead of quantizing it"
        )
