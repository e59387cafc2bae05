"""One readable line for a Ray out-of-memory kill instead of the raylet's 20-line report.

Ray's memory monitor kills the most recently scheduled worker when the node passes
``RAY_memory_usage_threshold`` (0.95 by default). The error reaches the driver as
``ray.exceptions.OutOfMemoryError`` (a task) or ``ActorDiedError`` with exit type
``NODE_OUT_OF_MEMORY`` (an actor); both carry the raylet's text, which names the killed
workers. Two layouts are understood: Ray 2.5x's ``N worker(s) were killed due to the node
running low on memory. Memory on the node (…) was 22.83GB used / 23.54GB limit (0.97) … Selected
to kill: (Actor(…): …, task name=TrainerWorker.__init__, required resources={}, pid=15556,
actual memory used=4.16GB, …`` and the older ``… where the task (actor ID: …,
name=TrainerWorker.train, pid=123, memory used=5.60GB) was running was 7.41GB / 7.77GB …``.
"""

from __future__ import annotations

import re

_WORKER = re.compile(
    r"name=(?P<name>[^,()]+),(?: required resources=\{[^}]*\},)? pid=(?P<pid>\d+), "
    r"(?:actual )?memory used=(?P<used>[\d.]+\s*GB)"
)
_NODE = re.compile(
    r"(?:was running was|Memory on the node \([^)]*\) was) (?P<node>[\d.]+\s*GB)(?: used)? / "
    r"(?P<total>[\d.]+\s*GB)"
)
_MARKERS = ("running low on memory", "NODE_OUT_OF_MEMORY", "OutOfMemoryError")


def oom_message(exc: BaseException) -> str | None:
    """A one-line explanation when ``exc`` (or its ``cause``) is a Ray OOM kill; else None.

    Names the killed actor (``TrainerWorker``), its pid and memory, and the node's usage.
    """
    text = f"{type(exc).__name__}: {exc}"
    cause = getattr(exc, "cause", None)
    if cause is not None:
        text += f"\n{type(cause).__name__}: {cause}"
    if not any(marker in text for marker in _MARKERS):
        return None
    workers, node = list(_WORKER.finditer(text)), _NODE.search(text)
    seen: dict[str, str] = {}
    for w in workers:  # each killed worker once, in the raylet's order
        actor = w["name"].strip().split(".")[0]
        seen.setdefault(w["pid"], f"{actor} (pid {w['pid']}, {w['used'].replace(' ', '')})")
    who = ", ".join(seen.values()) or "a Ray worker"
    where = f" when the node used {node['node']} of {node['total']}" if node else ""
    return (
        f"out of memory: Ray's memory monitor killed {who}{where}; free memory (close other "
        "programs, fewer rollout.n / data.prompts_per_step / trainer.micro_batch_size) and "
        "resume with checkpoint.resume=auto"
    )
