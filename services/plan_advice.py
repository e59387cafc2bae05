"""What to change when a placement plan does not fit: each candidate change is applied to the
spec, the plan is made again, and only changes that help are reported with the new numbers."""

from __future__ import annotations

from collections.abc import Callable

from fp8rl.protocol import JobSpec, SpecError
from fp8rl.protocol.loading import apply_override, validate_job_spec
from fp8rl.services.memory_estimate import GIB
from fp8rl.services.placement import PlacementPlan, plan_placement


def peak_gib(plan: PlacementPlan) -> float:
    """Estimated memory of the fullest GPU, in GiB (0 when nothing is estimated)."""
    return max((plan.gpu_bytes(g) for g in plan.used_gpus), default=0.0) / GIB


def candidate_overrides(job: JobSpec, plan: PlacementPlan) -> list[str]:
    """Changes worth trying for ``job`` (whose plan is ``plan``), as ``dotted.field=value``."""
    t, r, res = job.trainer, job.rollout, job.resources
    total = res.num_nodes * res.gpus_per_node
    out = []
    if t.offload == "none":
        out.append("trainer.offload=optimizer")
    if t.offload != "params_and_optimizer":
        out.append("trainer.offload=params_and_optimizer")
    free = total if res.placement == "colocated" else total - r.num_workers * r.gpus_per_worker
    if t.num_workers < free:
        out.append(f"trainer.num_workers={free}")
    if not t.gradient_checkpointing:
        out.append("trainer.gradient_checkpointing=true")
    if t.micro_batch_size > 1:
        out.append(f"trainer.micro_batch_size={max(1, t.micro_batch_size // 2)}")
    if r.backend == "vllm" and r.gpu_memory_utilization > 0.2:
        out.append(f"rollout.gpu_memory_utilization={round(r.gpu_memory_utilization - 0.1, 2)}")
    needed = max(plan.used_gpus, default=-1) + 1
    if needed > total:
        out.append(f"resources.num_nodes={-(-needed // res.gpus_per_node)}")
    return out


def advise(
    job: JobSpec, *, planner: Callable[[JobSpec], PlacementPlan] = plan_placement
) -> list[str]:
    """One line per single change that makes ``job``'s plan fit or lowers its peak GPU memory:
    ``field=value: peak A → B GiB (fits)``. Empty when the plan fits or nothing helps."""
    before = planner(job)
    if before.fits:
        return []
    lines = []
    for override in candidate_overrides(job, before):
        data = job.model_dump(mode="json")
        try:
            apply_override(data, override)
            changed = planner(validate_job_spec(data))
        except SpecError:
            continue
        peak_before, peak_after = peak_gib(before), peak_gib(changed)
        if (
            changed.fits
            or peak_after < peak_before - 0.05
            or len(changed.problems) < len(before.problems)
        ):
            verdict = "fits" if changed.fits else "still does not fit"
            lines.append(
                f"{override}: peak {peak_before:.1f} → {peak_after:.1f} GiB per GPU ({verdict})"
            )
    return lines
