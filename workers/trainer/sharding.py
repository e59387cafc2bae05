"""FSDP2 pieces of the native trainer: process group, sharded model build, host AdamW, reductions.

A sharded trainer is N Ray actors, one rank each, in one torch.distributed group (gloo on CPU,
NCCL on GPU). Each decoder block is its own FSDP2 unit (``fully_shard``); the root unit holds the
embeddings, the final norm and lm_head, and ``Decoder.score_responses`` is registered as an FSDP
forward method so one call gathers the root once. The model is built on ``meta`` and every rank
copies only its own shard of each full weight (``distribute_tensor(..., src_data_rank=None)``:
local slicing, no communication), so no rank ever holds a full unsharded model in memory.

Gradients: each rank's loss is already divided by the *global* denominator of its mini-batch, so
the cross-rank reduction must sum, not average. FSDP2 averages (gloo has no pre-multiplied sum
for ``set_gradient_divide_factor``), so the trainer scales each rank's loss by the world size.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

OFFLOADS = ("none", "optimizer", "params_and_optimizer")


def init_group(
    init_method: str, *, rank: int, world_size: int, device: torch.device, timeout_s: float = 1800
) -> Any:
    """Join the trainer's default process group; return its 1-D device mesh.

    gloo on CPU, NCCL on CUDA (the current device). The weight-sync group is separate
    (``weight_sync.collective`` builds its own from a TCP store).
    """
    from torch.distributed.device_mesh import init_device_mesh

    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(torch.cuda.current_device())  # this actor's GPU, before the mesh
    dist.init_process_group(
        backend=backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return init_device_mesh(device.type, (world_size,))


def shard_decoder(
    model: nn.Module, mesh: Any, *, offload: str, root: nn.Module | None = None
) -> None:
    """``fully_shard`` each decoder block, then the root (FSDP averages gradients over ranks).

    ``root``: the module whose forward the caller runs when it wraps the decoder (the critic's
    value model); the decoder itself by default. ``offload=params_and_optimizer`` puts the
    sharded parameters (and so gradients and the optimizer step) on the host through FSDP2's
    ``CPUOffloadPolicy``.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard, register_fsdp_forward_method

    if offload not in OFFLOADS:
        raise ValueError(f"trainer.offload={offload!r}; use one of {', '.join(OFFLOADS)}")
    kwargs: dict[str, Any] = {"mesh": mesh}
    if offload == "params_and_optimizer":
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda")
    for block in model.model.layers:
        fully_shard(block, **kwargs)
    if root is None:
        fully_shard(model, **kwargs)
        register_fsdp_forward_method(model, "score_responses")
    else:
        fully_shard(root, **kwargs)


def full_weights(
    spec: Any, precision: Any, *, param_dtype: torch.dtype, device: torch.device, seed: int
) -> tuple[dict[str, Tensor], Any]:
    """The full initial weights (HF names) of ``spec.path`` and its ``ModelSource``.

    A random preset has no weights on disk: it is the seeded init an unsharded worker of the
    same ``precision``, dtype, device and seed would build, so sharded and unsharded runs start
    from the same bits.
    """
    from fp8rl.workers.common import load_model
    from fp8rl.workers.model.loading import resolve_model

    source = resolve_model(spec.path)
    full = source.state_dict
    if full is None:
        unsharded = load_model(
            spec,
            precision,
            role="trainer",
            trainable=True,
            param_dtype=param_dtype,
            device=device,
            seed=seed,
            source=source,
        )[0]
        full = {k: v.detach() for k, v in unsharded.named_parameters()}
    return full, source


def load_full_weights(model: nn.Module, full: dict[str, Tensor]) -> None:
    """Copy this rank's shard of every full weight ``full[name]`` into the sharded ``model``.

    Raises:
        ValueError: names missing or unexpected, or shape mismatches (listed).
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    own = dict(model.named_parameters())
    given = dict(full)
    if model.config.tie_word_embeddings:
        given.pop("lm_head.weight", None)
    missing, extra = sorted(set(own) - set(given)), sorted(set(given) - set(own))
    if missing or extra:
        raise ValueError(
            f"checkpoint does not match the model: missing {missing[:8]}, unexpected {extra[:8]}"
        )
    with torch.no_grad():
        for name, param in own.items():
            src = given[name]
            if tuple(src.shape) != tuple(param.shape):
                raise ValueError(
                    f"{name}: checkpoint shape {tuple(src.shape)} != model {tuple(param.shape)}"
                )
            if isinstance(param, DTensor):
                local = param.to_local()
                shard = distribute_tensor(
                    src.to(local.dtype), param.device_mesh, param.placements, src_data_rank=None
                )
                local.copy_(shard.to_local())
            else:
                param.copy_(src.to(param.dtype))


def reset_buffers(model: nn.Module, device: torch.device) -> None:
    """Recompute the buffers ``to_empty`` left uninitialised: RoPE tables and KV-scale state."""
    from fp8rl.kernels.invariant import rope_table

    config = model.config
    cos, sin = rope_table(config.head_dim, model.rope_cos.shape[0], config.inv_freq())
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    for module in model.modules():
        if getattr(module, "kv_fp8", False):
            for name in ("k_scale", "v_scale", "kv_amax"):
                setattr(module, name, torch.zeros_like(getattr(module, name), device=device))


def full_tensor(param: Tensor) -> Tensor:
    """The whole tensor of a (possibly FSDP-sharded) parameter; collective for a DTensor."""
    from torch.distributed.tensor import DTensor

    return param.full_tensor() if isinstance(param, DTensor) else param


def local(tensor: Tensor) -> Tensor:
    """This rank's local data of a DTensor (the tensor itself otherwise)."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def all_reduce(values: Tensor, op: str) -> Tensor:
    """In-place all-reduce (``sum`` or ``max``) over the trainer group; a no-op without one."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return values
    on = values.to("cuda") if dist.get_backend() == "nccl" else values
    dist.all_reduce(on, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    if on is not values:
        values.copy_(on)
    return values


class HostAdamW(torch.optim.Optimizer):
    """AdamW whose state lives on the host (``trainer.offload: optimizer``).

    Parameters and gradients stay on the device. Each step streams one parameter's float32
    ``exp_avg``/``exp_avg_sq`` (this rank's shard, pinned host memory) to the device, runs
    ``torch.optim.adamw.adamw`` there and streams them back, so the device holds the state of
    one parameter at a time (the step itself is device-fast; the cost is 16 bytes per parameter
    over PCIe each way). On CPU the same code runs in place. The state has AdamW's names and
    shapes (DTensors when sharded), so ``torch.distributed.checkpoint`` saves and reshards it
    like AdamW's.
    """

    def __init__(
        self,
        params: Any,
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
    ) -> None:
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": False,
            "maximize": False,
        }
        super().__init__(params, defaults)

    def _state(self, param: Tensor) -> dict[str, Any]:
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            for key in ("exp_avg", "exp_avg_sq"):
                state[key] = _host_like(param)
        return state

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        """One AdamW update of every parameter that has a gradient."""
        from torch.optim.adamw import adamw

        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self._state(param)
                weight = local(param)
                hosts = [local(state["exp_avg"]), local(state["exp_avg_sq"])]
                moments = [h.to(weight.device, non_blocking=True) for h in hosts]
                adamw(
                    [weight],
                    [local(param.grad)],
                    moments[:1],
                    moments[1:],
                    [],
                    [state["step"]],
                    foreach=False,
                    amsgrad=False,
                    beta1=beta1,
                    beta2=beta2,
                    lr=group["lr"],
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    maximize=False,
                )
                for host, moment in zip(hosts, moments, strict=True):
                    if host is not moment:
                        host.copy_(moment, non_blocking=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()


def _host_like(param: Tensor) -> Tensor:
    from torch.distributed.tensor import DTensor

    pin = local(param).device.type == "cuda"
    zeros = torch.zeros(local(param).shape, dtype=torch.float32, device="cpu", pin_memory=pin)
    if isinstance(param, DTensor):
        return DTensor.from_local(
            zeros, param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
        )
    return zeros


def free_address() -> tuple[str, int]:
    """This node's IP (as Ray sees it) and a free TCP port (``ports.free_port``, all
    interfaces): a process group's rendezvous."""
    import ray

    from fp8rl.workers.ports import free_port

    return ray.util.get_node_ip_address(), free_port("")
