"""The placement plan as a table (``fp8rl validate --plan``): per GPU, its actors and their
estimated memory against ``resources.gpu_memory_gib``; then each role's memory terms."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fp8rl.services.memory_estimate import GIB
from fp8rl.services.placement import PlacementPlan


def plan_table(plan: PlacementPlan) -> Table:
    """One row per used GPU: node, local index, actors, estimated GiB, headroom."""
    table = Table(title=f"placement: {'colocated' if plan.colocated else 'disaggregated'}")
    for column in ("node", "gpu", "actors", "estimate GiB", f"of {plan.gpu_memory_gib:g} GiB"):
        table.add_column(column, justify="right" if "GiB" in column else "left")
    limit = plan.gpu_memory_gib * GIB
    for gpu in plan.used_gpus:
        actors = ", ".join(f"{role}[{i}]" for role, i in plan.actors_on(gpu))
        used = plan.gpu_bytes(gpu)
        estimate = f"{used / GIB:.1f}" if plan.memory else "?"
        verdict = (
            ""
            if not plan.memory
            else ("OVER" if used > limit else f"{(limit - used) / GIB:.1f} free")
        )
        table.add_row(
            str(plan.node_of(gpu)), str(gpu % plan.gpus_per_node), actors, estimate, verdict
        )
    return table


def role_terms(plan: PlacementPlan) -> list[str]:
    """``role: term a + term b … = total GiB`` for the first actor of each role on a GPU."""
    seen, lines = set(), []
    for (role, _), memory in plan.memory.items():
        if role in seen:
            continue
        seen.add(role)
        terms = " + ".join(f"{k} {v / GIB:.2f}" for k, v in memory.parts.items() if v)
        lines.append(f"{role} (per GPU): {terms} = {memory.total / GIB:.1f} GiB")
    return lines


def print_plan(plan: PlacementPlan, console: Console | None = None) -> None:
    """Render the plan: the table, the memory terms per role, and the notes."""
    console = console or Console(width=120, highlight=False)
    if not plan.on_gpu:
        console.print("placement: no actor holds a GPU (a CPU run): nothing to place")
        return
    console.print(plan_table(plan))
    for line in [*role_terms(plan), *plan.notes]:
        console.print(line, markup=False, soft_wrap=True)
