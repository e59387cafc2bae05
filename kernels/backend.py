"""Which kernel family runs the FP8 math on a device, decided once and reported by name.

Design notes
------------
The driver compares the backend every worker reports at start (DESIGN.md §4): a trainer on
``scaled_mm`` and a rollout engine on ``triton`` would run the same quantization but different
accumulation orders, so the run refuses to start. The choice is therefore a pure function of
(device, exact, what is importable), with no per-call randomness:

* CPU → ``"cpu-emulation"``: exact float64 emulation (``gemm.fp8_gemm_reference``). It is
  bitwise batch-invariant, so ``exact`` changes nothing there.
* CUDA, ``exact=True`` → ``"triton"``: the blockwise Triton GEMM with one fixed tile config,
  no split-K, the same reduction order for every M (batch-invariant). Without Triton the float64
  emulation (also exact, also batch-invariant) runs on the GPU and the name stays
  ``"cpu-emulation"``.
* CUDA, ``exact=False`` → ``"deepgemm"`` when ``deep_gemm`` imports, else ``"scaled_mm"`` when
  ``torch.nn.functional.scaled_mm`` has blockwise scaling and the GPU is Hopper (sm_90; cuBLASLt
  supports 1×128/128×128 there only), else ``"triton"``. Shapes the library refuses fall back to
  the Triton kernel (the same on every worker, since the shapes are the same).

Nothing here imports Triton or CUDA at module import: CPU CI imports ``fp8rl.kernels`` without
either.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

BACKENDS = ("cpu-emulation", "triton", "scaled_mm", "deepgemm")


@functools.cache
def triton_available() -> bool:
    """True when the ``triton`` package can be imported (it is not needed on CPU)."""
    return importlib.util.find_spec("triton") is not None


@functools.cache
def deepgemm_available() -> bool:
    """True when DeepGEMM (``deep_gemm``) can be imported."""
    return importlib.util.find_spec("deep_gemm") is not None


@functools.cache
def _scaled_mm_blockwise(device_index: int) -> bool:
    fn = getattr(torch.nn.functional, "scaled_mm", None)
    scaling = getattr(torch.nn.functional, "ScalingType", None)
    if fn is None or scaling is None or not hasattr(scaling, "BlockWise1x128"):
        return False
    return torch.cuda.get_device_capability(device_index)[0] == 9


def scaled_mm_blockwise_available(device: torch.device) -> bool:
    """True when ``torch.nn.functional.scaled_mm`` can run 1×128 × 128×128 scaling on ``device``."""
    if device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _scaled_mm_blockwise(index)


def kernel_backend(device: torch.device | str, *, exact: bool = False) -> str:
    """Name of the GEMM backend fp8rl uses on ``device``.

    Args:
        device: a torch device or its string (``"cpu"``, ``"cuda:0"``).
        exact: batch-invariant (bitwise-parity) mode, DESIGN.md §3 ``precision.exact``.
    Returns:
        one of ``"cpu-emulation"``, ``"triton"``, ``"scaled_mm"``, ``"deepgemm"`` (see module doc).
    Raises:
        ValueError: for device types other than cpu/cuda.
    """
    device = torch.device(device)
    if device.type == "cpu":
        return "cpu-emulation"
    if device.type != "cuda":
        raise ValueError(f"device must be cpu or cuda, got {device.type!r}")
    if exact:
        return "triton" if triton_available() else "cpu-emulation"
    if deepgemm_available():
        return "deepgemm"
    if scaled_mm_blockwise_available(device):
        return "scaled_mm"
    return "triton" if triton_available() else "cpu-emulation"
