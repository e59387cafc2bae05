"""GPU placement of a job's actors: a plan (pure, checked by ``fp8rl validate --plan``) and its Ray
placement group (one bundle per GPU).

Layout, for ``resources.num_nodes × resources.gpus_per_node`` GPUs numbered node by node:

- ``colocated``: every role starts at GPU 0, so trainer rank i, engine i, reference i and critic i
  share GPU i (an engine with tensor parallelism k holds GPUs ik…ik+k-1). Each actor asks Ray for
  an equal fraction of the GPUs it shares.
- ``disaggregated``: trainer ranks (with the critic ranks on the same GPUs), then reference actors,
  then engines take disjoint GPUs in that order; an engine never straddles two nodes.

An actor whose role has ``gpus_per_worker: 0`` runs without a GPU. On CPU (``resources.device:
cpu``, or no role asks for GPUs) the plan places nothing and no placement group is created.

As in verl and NeMo RL, the placement group is created once for the run and every actor is
scheduled into its bundle, so Ray cannot pack two ranks onto one GPU, and a rank's GPU is known
before it starts (what the weight transport and the memory estimate rely on).
"""

from __future__ import annotations

import math
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from fp8rl.protocol import JobSpec
from fp8rl.services.memory_estimate import GIB, ActorMemory, model_shape, role_memory

Actor = tuple[str, int]
"""(role, index) of one actor: ``("trainer", 0)``, ``("rollout", 3)``."""

ROLE_ORDER = ("trainer", "critic", "reference", "rollout")


@dataclass
class PlacementPlan:
    """Which GPUs each actor holds and the estimated memory of each GPU.

    GPU ``g`` is local GPU ``g % gpus_per_node`` of node ``g // gpus_per_node``.
    """

    num_nodes: int
    gpus_per_node: int
    gpu_memory_gib: float
    colocated: bool
    cpus_per_worker: float
    assignments: dict[Actor, tuple[int, ...]] = field(default_factory=dict)
    memory: dict[Actor, ActorMemory] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def on_gpu(self) -> bool:
        """Whether any actor holds a GPU."""
        return any(self.assignments.values())

    @property
    def used_gpus(self) -> list[int]:
        """GPUs holding at least one actor, ascending."""
        return sorted({g for gpus in self.assignments.values() for g in gpus})

    @property
    def fits(self) -> bool:
        """No problem found (GPU count, node boundaries, memory)."""
        return not self.problems

    def gpus_of(self, role: str, index: int) -> tuple[int, ...]:
        """GPUs of one actor (empty: it runs without a GPU). Raises KeyError for an unknown actor."""
        return self.assignments[(role, index)]

    def same_gpu(self, a: Actor, b: Actor) -> bool:
        """Whether two actors share at least one GPU."""
        return bool(set(self.assignments[a]) & set(self.assignments[b]))

    def actors_on(self, gpu: int) -> list[Actor]:
        """Actors holding ``gpu``, in role order."""
        return [actor for actor, gpus in self.assignments.items() if gpu in gpus]

    def gpu_share(self, gpu: int) -> float:
        """Fraction of ``gpu`` each of its actors asks Ray for (1/number of actors, rounded down
        to Ray's 1e-4 resolution so the fractions never sum above 1)."""
        count = len(self.actors_on(gpu))
        return math.floor(10_000 / count) / 10_000 if count else 0.0

    def gpu_bytes(self, gpu: int) -> float:
        """Estimated bytes on ``gpu`` (0 when the model's shape is unknown)."""
        return sum(self.memory[a].total for a in self.actors_on(gpu) if a in self.memory)

    def node_of(self, gpu: int) -> int:
        """Node index of ``gpu``."""
        return gpu // self.gpus_per_node


def plan_placement(job: JobSpec, *, read_config: bool = True) -> PlacementPlan:
    """The placement and memory plan of ``job`` against the cluster its ``resources`` declare.

    ``read_config``: the model's shape may come from its ``config.json`` on this machine (the
    REST API passes False: it never reads paths from request input).

    Never raises for a bad layout: every reason it cannot run is one ``field: reason`` line in
    ``problems`` (``placement_problems`` hands them to preflight).
    """
    res = job.resources
    plan = PlacementPlan(
        num_nodes=res.num_nodes,
        gpus_per_node=res.gpus_per_node,
        gpu_memory_gib=res.gpu_memory_gib,
        colocated=res.placement == "colocated",
        cpus_per_worker=res.cpus_per_worker,
    )
    roles = role_sizes(job)
    plan.problems += _shape_problems(job, roles)
    on_gpu = res.device != "cpu" and any(gpus for _, gpus in roles.values())
    if not on_gpu:
        for role, (count, _) in roles.items():
            plan.assignments.update({(role, i): () for i in range(count)})
        return plan
    _assign(plan, roles)
    total = res.num_nodes * res.gpus_per_node
    needed = max(plan.used_gpus, default=-1) + 1
    if needed > total:
        plan.problems.append(
            f"resources: the plan needs {needed} GPUs ({_role_summary(roles)}, "
            f"{res.placement}); num_nodes × gpus_per_node = {res.num_nodes} × "
            f"{res.gpus_per_node} = {total}"
        )
    _estimate(plan, job, read_config=read_config)
    return plan


def role_sizes(job: JobSpec) -> dict[str, tuple[int, int]]:
    """``role: (actors, GPUs per actor)`` for the roles that hold devices."""
    sizes = {"trainer": (job.trainer.num_workers, job.trainer.gpus_per_worker)}
    if job.algorithm.advantage_estimator == "gae":
        sizes["critic"] = (job.trainer.num_workers, job.trainer.gpus_per_worker)
    if job.reference_enabled:
        sizes["reference"] = (job.reference.num_workers, job.reference.gpus_per_worker)
    sizes["rollout"] = (job.rollout.num_workers, job.rollout.gpus_per_worker)
    return sizes


def _role_summary(roles: dict[str, tuple[int, int]]) -> str:
    return ", ".join(f"{n} {role} × {g} GPU" for role, (n, g) in roles.items() if g)


def _shape_problems(job: JobSpec, roles: dict[str, tuple[int, int]]) -> list[str]:
    out = []
    for role in ("trainer", "reference"):
        if role in roles and roles[role][1] > 1:
            out.append(
                f"{role}.gpus_per_worker: {roles[role][1]}; each {role} rank holds one GPU "
                f"(FSDP shards across ranks): use {role}.num_workers for more GPUs"
            )
    tp = getattr(job.rollout, "tensor_parallel_size", None)
    gpus = job.rollout.gpus_per_worker
    if tp is None and gpus > 1:
        out.append(
            f"rollout.gpus_per_worker: {gpus}; the native engine runs on one GPU (use "
            "rollout.num_workers for more engines)"
        )
    if tp is not None and gpus and gpus != tp:
        out.append(
            f"rollout.gpus_per_worker: {gpus}, but rollout.tensor_parallel_size is {tp}; "
            "an engine holds one GPU per tensor-parallel rank"
        )
    if gpus > job.resources.gpus_per_node:
        out.append(
            f"rollout.gpus_per_worker: {gpus} GPUs per engine do not fit one node "
            f"(resources.gpus_per_node={job.resources.gpus_per_node})"
        )
    return out


def _assign(plan: PlacementPlan, roles: dict[str, tuple[int, int]]) -> None:
    cursor = 0
    for role in ROLE_ORDER:
        if role not in roles:
            continue
        count, gpus = roles[role]
        if plan.colocated:
            cursor = 0
        for i in range(count):
            if role == "critic":  # critic rank i shares trainer rank i's GPUs
                plan.assignments[(role, i)] = plan.assignments[("trainer", i)]
            elif not gpus:
                plan.assignments[(role, i)] = ()
            else:
                cursor = _aligned(cursor, gpus, plan.gpus_per_node)
                plan.assignments[(role, i)] = tuple(range(cursor, cursor + gpus))
                cursor += gpus


def _aligned(first: int, width: int, per_node: int) -> int:
    """``first``, or the next node's first GPU when ``width`` GPUs from ``first`` would straddle
    a node boundary (and fit on one node)."""
    if width <= per_node and first % per_node + width > per_node:
        return (first // per_node + 1) * per_node
    return first


def _estimate(plan: PlacementPlan, job: JobSpec, *, read_config: bool) -> None:
    cfg = model_shape(job.model.path, read_config=read_config)
    if cfg is None:
        plan.notes.append(
            f"model.path: the shape of {job.model.path} is unknown here (no config.json, no "
            "preset name), so memory is not estimated"
        )
        return
    for actor, gpus in plan.assignments.items():
        if gpus:
            plan.memory[actor] = role_memory(job, cfg, actor[0])
    limit = plan.gpu_memory_gib * GIB
    for gpu in plan.used_gpus:
        used = plan.gpu_bytes(gpu)
        if used > limit:
            parts = ", ".join(
                f"{r}[{i}] {plan.memory[(r, i)].total / GIB:.1f}" for r, i in plan.actors_on(gpu)
            )
            plan.problems.append(
                f"resources.gpu_memory_gib: GPU {gpu} (node {plan.node_of(gpu)}) needs an "
                f"estimated {used / GIB:.1f} GiB > {plan.gpu_memory_gib:g} GiB ({parts} GiB)"
            )


def placement_problems(job: JobSpec, *, local: bool = True) -> list[str]:
    """``field: reason`` lines for everything the placement plan of ``job`` cannot do."""
    return plan_placement(job, read_config=local).problems


def bundle_order(bundle_nodes: list[str]) -> list[int]:
    """Physical bundle index for each plan GPU: bundles grouped by node (nodes in order of their
    first bundle), bundle index order inside a node. ``bundle_nodes[b]`` is bundle b's node id.

    Ray's ``PACK`` strategy may interleave bundles of different nodes; the plan numbers GPUs node
    by node, so plan GPU g runs in bundle ``bundle_order(...)[g]``.
    """
    nodes = list(dict.fromkeys(bundle_nodes))
    return [b for node in nodes for b, n in enumerate(bundle_nodes) if n == node]


def actor_options(plan: PlacementPlan, role: str, index: int, placement: Any = None) -> dict:
    """Ray ``.options(...)`` for one actor: its bundle and GPU fraction under ``placement`` (a
    ``RayPlacement``), or CPU-only options (no GPU, no reserved core) when there is none."""
    if placement is None or not plan.gpus_of(role, index):
        return {"num_cpus": 0, "num_gpus": 0}
    return placement.options(role, index)


class RayPlacement:
    """The run's Ray placement group: one bundle ``{GPU: 1, CPU: c}`` per plan GPU, where ``c`` is
    ``cpus_per_worker`` times the actors sharing that GPU.

    Blocks until Ray has reserved every bundle (``timeout_s``), then maps plan GPUs to bundles
    (``bundle_order``). ``remove()`` gives the GPUs back.

    Raises:
        TimeoutError: the cluster cannot hold the bundles (too few GPUs or CPUs), naming them.
    """

    def __init__(self, plan: PlacementPlan, *, timeout_s: float = 600.0) -> None:
        import ray
        from ray.util.placement_group import placement_group, placement_group_table

        self.plan = plan
        count = max(plan.used_gpus) + 1
        bundles = [
            {"GPU": 1, "CPU": plan.cpus_per_worker * max(1, len(plan.actors_on(g)))}
            for g in range(count)
        ]
        strategy = "STRICT_PACK" if plan.num_nodes == 1 else "PACK"
        self.group = placement_group(bundles, strategy=strategy, name="")
        ready, _ = ray.wait([self.group.ready()], timeout=timeout_s)
        if not ready:
            self.remove()
            raise TimeoutError(
                f"Ray could not reserve {count} GPU bundles ({strategy}) in {timeout_s:.0f} s: "
                f"the cluster has {ray.cluster_resources().get('GPU', 0):g} GPUs; check "
                "resources.num_nodes and resources.gpus_per_node"
            )
        table = placement_group_table(self.group)
        nodes = [table["bundles_to_node_id"][b] for b in range(count)]
        self.order = bundle_order(nodes)

    def options(self, role: str, index: int) -> dict:
        """Ray actor options of one actor: scheduled into its first GPU's bundle with that GPU's
        share. A multi-GPU engine (vLLM tensor parallelism, whose ``mp`` executor starts one
        process per GPU) instead asks ``num_gpus=0`` and sees exactly its bundles' devices:
        ``CUDA_VISIBLE_DEVICES`` set from ``bundle_gpu_ids``, which Ray is told not to override."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        gpus = self.plan.gpus_of(role, index)
        opts: dict[str, Any] = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.group,
                placement_group_bundle_index=self.order[gpus[0]],
                placement_group_capture_child_tasks=True,
            ),
            "num_cpus": self.plan.cpus_per_worker,
            "num_gpus": self.plan.gpu_share(gpus[0]),
        }
        if len(gpus) > 1:
            opts["num_gpus"] = 0
            devices = ",".join(self.bundle_gpu_ids(g) for g in gpus)
            opts["runtime_env"] = {
                "env_vars": {
                    "CUDA_VISIBLE_DEVICES": devices,
                    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
                }
            }
        return opts

    def bundle_gpu_ids(self, gpu: int) -> str:
        """The device id Ray gave the bundle of plan GPU ``gpu`` (a probe task in that bundle)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=self.order[gpu]
        )
        probe = ray.remote(_gpu_ids).options(
            num_cpus=0, num_gpus=self.plan.gpu_share(gpu) / 2, scheduling_strategy=strategy
        )
        return ",".join(ray.get(probe.remote()))

    def remove(self) -> None:
        """Release the placement group (its actors must be gone or will be killed)."""
        from ray.util.placement_group import remove_placement_group

        with suppress(Exception):  # already removed, or Ray shut down first
            remove_placement_group(self.group)


def _gpu_ids() -> list[str]:
    import ray

    return [str(g) for g in ray.get_gpu_ids()]
