"""What every model-holding worker shares: device choice, model loading for a role, the handshake."""

from __future__ import annotations

import torch

from fp8rl.protocol import Handshake, ModelSpec, PrecisionSpec
from fp8rl.workers.model.build import DTYPES, build_decoder, layer_precision
from fp8rl.workers.model.decoder import Decoder
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.model.loading import ModelSource, resolve_model


def pick_device(device: str) -> torch.device:
    """``auto`` → ``cuda`` when available else ``cpu``; ``cuda`` without a GPU raises ValueError."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("resources.device=cuda but no CUDA device is visible to this worker")
    return torch.device(device)


def load_model(
    model: ModelSpec,
    precision: PrecisionSpec,
    *,
    role: str,
    trainable: bool,
    param_dtype: torch.dtype | None = None,
    device: torch.device,
    seed: int,
    source: ModelSource | None = None,
) -> tuple[Decoder, ModelSource]:
    """Resolve ``model.path`` and build the shared decoder with the role's precision."""
    source = source or resolve_model(model.path)
    lp = layer_precision(model, precision, role=role, trainable=trainable)
    decoder = build_decoder(
        source.config,
        lp,
        state_dict=source.state_dict,
        max_positions=model.max_model_len,
        param_dtype=param_dtype or DTYPES[model.dtype],
        device=device,
        seed=seed,
    )
    return decoder, source


def handshake(
    role: str,
    precision: PrecisionSpec,
    lp: LayerPrecision,
    *,
    device: torch.device,
    rank: int = 0,
    backend: str = "native",
) -> Handshake:
    """The worker's quant report (DESIGN.md §4): fingerprint, kernel backend, exact mode."""
    from fp8rl.kernels import kernel_backend

    kernels = (
        kernel_backend(device, exact=lp.exact)
        if lp.fp8
        else f"dense-{'exact' if lp.exact else 'torch'}"
    )
    return Handshake(
        role=role,
        rank=rank,
        precision_mode=precision.mode,
        fp8=lp.fp8,
        quant=lp.quant,
        quant_fingerprint=lp.quant.fingerprint() if lp.fp8 else None,
        kernel_backend=kernels,
        exact=lp.exact,
        device=str(device),
        backend=backend,
    )


def gpu_location(device: torch.device) -> tuple[str, str | None]:
    """``(Ray node id, GPU UUID)`` of a worker (UUID None off CUDA): which physical GPU it uses,
    for choosing CUDA IPC (same GPU only) or NCCL."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    if device.type != "cuda":
        return node, None
    return node, str(torch.cuda.get_device_properties(device).uuid)
