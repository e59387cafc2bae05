"""Ray runtime for a run: attach or start Ray, launch one actor per role, enforce the quant contract.

Placement (``resources.placement``, ``services.placement``): one Ray placement group with a bundle
per GPU; ``colocated`` puts trainer rank i, engine i and reference i on GPU i (fractional GPUs),
``disaggregated`` gives each role its own GPUs. On CPU every actor is a local process.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import ray

from fp8rl.protocol import Handshake, JobSpec, PrecisionSpec
from fp8rl.services.placement import PlacementPlan, RayPlacement, actor_options, plan_placement
from fp8rl.services.reward_pool import RewardPool
from fp8rl.workers.ports import free_port

log = logging.getLogger(__name__)


class QuantContractError(RuntimeError):
    """Workers disagree on the quantization contract; the run must not start."""


LOCAL_MALLOC_ENV = {
    "MALLOC_ARENA_MAX": "2",
    "MALLOC_TRIM_THRESHOLD_": str(64 * 2**20),
    "MALLOC_MMAP_THRESHOLD_": str(4 * 2**20),
}
"""glibc malloc settings a private local Ray's workers inherit (see ``init_ray``)."""

RAY_PRESTART = "RAY_prestart_worker_first_driver"
"""Ray's setting (its case) for prestarting idle workers when the first driver connects."""


def local_cpu_threads(job: JobSpec) -> int:
    """Torch threads per worker of a private local Ray: the usable cores shared by the workers
    of the largest role (the roles compute one phase at a time: rollout, reference, trainer).

    Ray gives an actor that reserves no core one thread (``OMP_NUM_THREADS=1``), so on the
    2-core quickstart machine the trainer trained on one core while the other idled.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    busiest = max(job.trainer.num_workers, job.rollout.num_workers, job.reference.num_workers)
    return max(1, (cores or 1) // busiest)


def init_ray(address: str | None, *, cpu_threads: int | None = None) -> None:
    """Attach to ``address``, else to ``$RAY_ADDRESS`` (``ray job submit``), else to a local cluster
    that answers on its GCS port (``ray start --head``), else start a private local Ray.

    A stale ``/tmp/ray/ray_current_cluster`` left by a stopped cluster is ignored instead of
    hanging in ``ray.init``. The private Ray is a head with a watchdog (``private_ray.py``): it
    is stopped at exit, and also when this process is killed or interrupted (Ctrl-C), however
    early, while the head is still starting included. Its workers inherit
    ``OMP_NUM_THREADS=cpu_threads`` (``local_cpu_threads``) unless the environment sets it.
    """
    if ray.is_initialized():
        return
    # No runtime_env here: under `ray job submit` it would conflict with the job's own. A local
    # Ray started by this process inherits this environment (so its actors do too).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if address is None and not os.environ.get("RAY_ADDRESS"):
        # A private local Ray (the quickstart on a small machine): its workers inherit glibc
        # malloc settings that return freed memory to the OS (few arenas, trim and mmap
        # thresholds), so their RSS follows their live tensors between steps.
        for key, value in LOCAL_MALLOC_ENV.items():
            os.environ.setdefault(key, value)
        if cpu_threads is not None:
            os.environ.setdefault("OMP_NUM_THREADS", str(cpu_threads))
        # Ray prestarts one worker per core for the first driver; the actors start their own,
        # and an unused one idles at ~0.05 GB (a hybrid engine's run has one actor for 2 cores)
        os.environ.setdefault(RAY_PRESTART, "0")
        address = _reachable_local_cluster()
        if address is None:  # fp8rl logs the private head's address; Ray's own INFO line
            address = _private_head()  # ("Connecting to … 192.0.2.2:port") names the node IP
            ray.init(address=address, log_to_driver=True, logging_level=logging.WARNING)
            return
    ray.init(address=address, log_to_driver=True)


def _private_head() -> str:
    """Start a private Ray head (stopped at exit, or by its watchdog if this process dies)."""
    import atexit

    from fp8rl.services.private_ray import start_private_ray

    private = start_private_ray()
    atexit.register(private.stop)
    atexit.register(ray.shutdown)  # runs first (LIFO): disconnect before the head goes
    return private.head.gcs_address


def _reachable_local_cluster() -> str | None:
    try:
        from ray._private.utils import read_ray_address

        known = read_ray_address()
    except Exception:  # private helper moved: just start a local Ray
        return None
    if not known:
        return None
    host, _, port = known.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return known
    except (OSError, ValueError):
        log.info("ignoring unreachable Ray address %s; starting a local Ray", known)
        return None


def check_handshakes(reports: list[Handshake], precision: PrecisionSpec) -> list[str]:
    """Notes for the run metadata; raises QuantContractError when FP8 workers disagree.

    unified_fp8: trainer, reference and every rollout engine must report FP8 with the same
    QuantConfig (the message names the differing fields) and the same exact flag.
    fp8_rollout: the trainer is BF16 by design — recorded as a note, not refused.
    """
    by_role: dict[str, list[Handshake]] = {}
    for r in reports:
        by_role.setdefault(r.role, []).append(r)
    problems, notes = [], []
    trainer = by_role["trainer"][0]
    for r in reports:
        if r.role == "reward":
            continue
        name = f"{r.role}[{r.rank}]"
        if r.precision_mode != precision.mode:
            problems.append(
                f"{name} runs precision mode {r.precision_mode}, the job asks {precision.mode}"
            )
        if r.exact != precision.exact:
            problems.append(f"{name} has exact={r.exact}, the job asks exact={precision.exact}")
        expected_fp8 = precision.rollout_fp8 if r.role == "rollout" else precision.trainer_fp8
        if r.fp8 != expected_fp8:
            problems.append(f"{name} fp8={r.fp8}, mode {precision.mode} needs fp8={expected_fp8}")
        if r.fp8 and r.quant is not None and r.quant_fingerprint != precision.quant.fingerprint():
            fields = r.quant.differing_fields(precision.quant)
            problems.append(
                f"{name} quant fingerprint {r.quant_fingerprint} != "
                f"{precision.quant.fingerprint()}; differing fields: {', '.join(fields)}"
            )
    for r in by_role.get("rollout", []):
        if r.fp8 and trainer.fp8 and r.quant_fingerprint != trainer.quant_fingerprint:
            fields = r.quant.differing_fields(trainer.quant) if r.quant and trainer.quant else []
            problems.append(
                f"rollout[{r.rank}] and trainer quantize differently; differing fields: "
                f"{', '.join(fields) or 'fingerprint'}"
            )
    if problems:
        raise QuantContractError(
            "quant contract violated, run not started:\n  " + "\n  ".join(problems)
        )
    if precision.mode == "fp8_rollout":
        notes.append(
            "fp8_rollout: trainer forward is BF16 while rollout is FP8 (mismatch by design)"
        )
    return notes


@dataclass
class Workers:
    """Actor handles of a run."""

    trainers: list[Any]
    rollout: list[Any]
    reward: RewardPool
    references: list[Any] = field(default_factory=list)
    critics: list[Any] = field(default_factory=list)
    transport: str = "object_store"
    notes: list[str] = field(default_factory=list)
    plan: PlacementPlan | None = None
    placement: RayPlacement | None = None
    hybrid: bool = False  # the engine runs in trainer rank 0's process (resources.hybrid_engine)

    @property
    def trainer(self) -> Any:
        """Trainer rank 0 (the one that sends weight updates)."""
        return self.trainers[0]

    @property
    def engines_share_gpus(self) -> bool:
        """Whether an engine holds a GPU that a trainer or critic rank trains on (colocated)."""
        assignments = self.plan.assignments if self.plan is not None else {}
        train = {
            g for (r, _), gpus in assignments.items() if r in ("trainer", "critic") for g in gpus
        }
        return any(set(gpus) & train for (r, _), gpus in assignments.items() if r == "rollout")

    def release_engines(self) -> None:
        """Engines that share memory with trainer ranks (a colocated GPU, or a hybrid engine's
        process) free it for them (KV cache; weights where the backend can:
        ``RolloutBackend.release_memory``); no-op otherwise."""
        if self.engines_share_gpus or self.hybrid:
            ray.get([e.release_memory.remote() for e in self.rollout])

    def resume_engines(self) -> None:
        """Undo ``release_engines`` before the weight sync and the next rollout."""
        if self.engines_share_gpus or self.hybrid:
            ray.get([e.resume_memory.remote() for e in self.rollout])

    @property
    def stateful(self) -> list[Any]:
        """The ranks a checkpoint saves and restores: trainer ranks, then critic ranks."""
        return [*self.trainers, *self.critics]


@contextmanager
def running_workers(job: JobSpec) -> Iterator[Workers]:
    """``launch_workers`` for the duration of a ``with`` block; the actors are killed on the way
    out (success, error or Ctrl-C), so no half-started actor outlives the driver; then the
    placement group is removed."""
    started: list[Any] = []
    plan, placement, workers = plan_placement(job), None, None
    try:
        placement = RayPlacement(plan) if plan.on_gpu else None
        workers = launch_workers(job, started=started, plan=plan, placement=placement)
        yield workers
    finally:
        if workers is not None:
            workers.reward.close()  # an in-driver reward's verifier children
        for actor in started:
            with suppress(Exception):
                ray.kill(actor)
        if placement is not None:
            placement.remove()


def launch_workers(
    job: JobSpec,
    *,
    started: list[Any] | None = None,
    plan: PlacementPlan | None = None,
    placement: RayPlacement | None = None,
) -> Workers:
    """Start the actors of ``job`` (each gets only its own sub-specs) and check their handshakes.

    GPUs: each actor runs in the bundle of its plan GPU (``services.placement``); ``placement``
    is created here when the plan holds GPUs and none is given (the caller removes it:
    ``Workers.placement``). On CPU actors reserve no cores.
    """
    from fp8rl.workers.critic.worker import CriticWorker
    from fp8rl.workers.reference.worker import ReferenceWorker
    from fp8rl.workers.trainer.worker import TrainerWorker, needs_group

    device, seed = job.resources.device, job.seed
    plan = plan or plan_placement(job)
    if placement is None and plan.on_gpu:
        placement = RayPlacement(plan)

    def opts(role: str, index: int = 0) -> dict[str, Any]:
        return actor_options(plan, role, index, placement)

    engines: list[Any] = []  # engine actors (a hybrid engine lives in the trainer's actor)
    if job.resources.hybrid_engine:
        from fp8rl.services.hybrid import launch_hybrid

        trainer, view = launch_hybrid(job, opts("trainer", 0))
        trainers, rollout = [trainer], [view]
    else:
        if job.trainer.backend == "megatron":
            trainers = _megatron_ranks(job, opts)
        else:
            trainers = _trainer_ranks(job, ray.remote(TrainerWorker), opts)
        rollout = engines = [
            _rollout_actor(job)
            .options(**opts("rollout", rank))
            .remote(job.model, job.rollout, job.precision, device=device, rank=rank, seed=seed)
            for rank in range(job.rollout.num_workers)
        ]
    references = []
    if job.reference_enabled:
        references = [
            ray.remote(ReferenceWorker)
            .options(**opts("reference", index))
            .remote(
                job.model,
                job.precision,
                device=device,
                micro_batch_size=job.trainer.micro_batch_size,
                seed=seed,
            )
            for index in range(job.reference.num_workers)
        ]
    critics = []
    if job.algorithm.advantage_estimator == "gae":  # critic rank i beside trainer rank i
        critics = [
            ray.remote(CriticWorker)
            .options(**opts("critic", rank))
            .remote(
                job.model,
                job.trainer,
                job.algorithm,
                device=device,
                seed=seed,
                rank=rank,
                world_size=job.trainer.num_workers,
            )
            for rank in range(job.trainer.num_workers)
        ]
    reward = RewardPool(job.reward)
    if started is not None:  # the caller kills what was started, even if a handshake fails below
        started.extend(
            a for a in (*trainers, *engines, *references, *critics, *reward.actors) if a is not None
        )
    if needs_group(job.trainer):  # join the FSDP/Megatron groups: rank 0's address, all at once
        for group in (trainers, critics):
            if group:
                host, port = ray.get(group[0].free_address.remote())
                ray.get([rank.join.remote(f"tcp://{host}:{port}") for rank in group])
    workers = Workers(
        trainers=trainers,
        rollout=rollout,
        reward=reward,
        references=references,
        critics=critics,
        plan=plan,
        placement=placement,
        hybrid=job.resources.hybrid_engine,
    )
    reports = ray.get([a.handshake.remote() for a in [*trainers, *rollout, *references]])
    workers.notes = check_handshakes(reports, job.precision)
    for r in reports:
        log.info(
            "%s[%d]: fp8=%s fingerprint=%s kernels=%s exact=%s device=%s",
            r.role,
            r.rank,
            r.fp8,
            r.quant_fingerprint,
            r.kernel_backend,
            r.exact,
            r.device,
        )
    workers.transport = setup_transport(workers, job, reports)
    return workers


def auto_transport(sender: tuple[str, str | None], engines: list[tuple[str, str | None]]) -> str:
    """``cuda_ipc`` when every engine's ``(node id, GPU UUID)`` is the sender's, else ``nccl``.

    CUDA IPC handles only open on the GPU that made them; one engine elsewhere needs NCCL.
    """
    same = sender[1] is not None and all(e == sender for e in engines)
    return "cuda_ipc" if same else "nccl"


def _trainer_ranks(job: JobSpec, actor: Any, opts: Callable[[str, int], dict]) -> list[Any]:
    """``trainer.num_workers`` TrainerWorker actors (placed by ``opts``); sharded ones wait for
    ``join``."""
    n = job.trainer.num_workers
    return [
        actor.options(**opts("trainer", rank)).remote(
            job.model,
            job.trainer,
            job.algorithm,
            job.precision,
            total_steps=job.steps,
            batch_size=job.batch_size,
            device=job.resources.device,
            seed=job.seed,
            rank=rank,
            world_size=n,
        )
        for rank in range(n)
    ]


def _megatron_ranks(job: JobSpec, opts: Callable[[str, int], dict]) -> list[Any]:
    """``trainer.num_workers`` MegatronTrainer actors, rank r = tp + TP·(dp + DP·pp), each
    running ``initialize_model_parallel`` in its ``join``; several ranks wait for ``join`` (rank
    0's node address), one rank joins a local group at once."""
    from fp8rl.workers.trainer.megatron.trainer import MegatronTrainer
    from fp8rl.workers.trainer.worker import needs_group

    n = job.trainer.num_workers
    return [
        ray.remote(MegatronTrainer)
        .options(**opts("trainer", rank))
        .remote(
            job.model,
            job.trainer,
            job.algorithm,
            job.precision,
            total_steps=job.steps,
            batch_size=job.batch_size,
            device=job.resources.device,
            seed=job.seed,
            rank=rank,
            world=n,
            port=free_port(),
            defer=needs_group(job.trainer),
        )
        for rank in range(n)
    ]


def setup_transport(workers: Workers, job: JobSpec, reports: list[Handshake]) -> str:
    """Pick and initialise the weight transport (``resources.weight_transport``); return its name.

    ``auto``: the object store on CPU; CUDA IPC only when every engine is on the very GPU of
    trainer rank 0 (same node, same GPU UUID); otherwise an NCCL broadcast group (trainer rank 0
    = group rank 0). ``nccl`` on CPU uses gloo. A hybrid engine (``resources.hybrid_engine``)
    receives in memory (``local``; its worker joined that transport when it started).
    """
    if job.resources.hybrid_engine:  # trainer and engine share a process
        return "local"
    name = job.resources.weight_transport
    on_gpu = any(r.device.startswith("cuda") for r in reports if r.role in ("trainer", "rollout"))
    if name == "auto":
        name = "object_store"
        if on_gpu:
            sender, *engines = ray.get(
                [a.gpu_location.remote() for a in [workers.trainer, *workers.rollout]]
            )
            name = auto_transport(sender, engines)
    if name == "object_store":
        return name
    if name == "cuda_ipc":
        ray.get([a.init_transport.remote("cuda_ipc") for a in [workers.trainer, *workers.rollout]])
        return name
    host, port = ray.get(workers.trainer.free_address.remote())
    world = 1 + len(workers.rollout)
    common = {
        "init_method": f"tcp://{host}:{port}",
        "world_size": world,
        "backend": "nccl" if on_gpu else "gloo",
    }
    ray.get(
        [
            workers.trainer.init_transport.remote("nccl", rank=0, **common),
            *[
                w.init_transport.remote("nccl", rank=i + 1, **common)
                for i, w in enumerate(workers.rollout)
            ],
        ]
    )
    return name


def planned_transport(plan: PlacementPlan, num_engines: int, on_gpu: bool) -> str:
    """``resources.weight_transport: auto``: ``object_store`` on CPU, ``cuda_ipc`` when every
    engine shares trainer rank 0's GPU (IPC handles only open on the same device), else ``nccl``."""
    if not on_gpu:
        return "object_store"
    same = all(plan.same_gpu(("trainer", 0), ("rollout", i)) for i in range(num_engines))
    return "cuda_ipc" if same else "nccl"


def _rollout_actor(job: JobSpec) -> Any:
    if job.rollout.backend == "native":
        from fp8rl.workers.rollout.worker import RolloutWorker

        return ray.remote(RolloutWorker)
    if job.rollout.backend == "vllm":
        from fp8rl.workers.rollout.vllm import VLLMRolloutWorker

        return ray.remote(VLLMRolloutWorker)
    if job.rollout.backend == "sglang":
        from fp8rl.workers.rollout.sglang import SGLangRolloutWorker

        return ray.remote(SGLangRolloutWorker)
    raise ValueError(f"rollout.backend={job.rollout.backend} is not implemented")
