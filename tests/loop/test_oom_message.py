"""A Ray OOM kill is reported in one line naming the killed actor and its memory."""

from __future__ import annotations

from ray.exceptions import OutOfMemoryError

from fp8rl.services.oom import oom_message

RAYLET_TEXT = (
    "Task was killed due to the node running low on memory.\n"
    "Memory on the node (IP: 10.0.0.7, ID: 3f2a) where the task (actor ID: 9c1e, "
    "name=TrainerWorker.train, pid=48213, memory used=5.60GB) was running was 7.41GB / 7.77GB "
    "(0.953), which exceeds the memory usage threshold of 0.95. Ray killed this worker (ID: "
    "77ab) because it was the most recently scheduled task; to see more information about "
    "memory usage on this node, use `ray logs raylet.out -ip 10.0.0.7`.\n"
    "Top 10 memory users:\nPID\tMEM(GB)\tCOMMAND\n48213\t5.60\tray::TrainerWorker.train\n"
)


def test_oom_kill_becomes_one_line_with_actor_pid_and_memory():
    line = oom_message(OutOfMemoryError(RAYLET_TEXT))
    assert line is not None and "\n" not in line
    assert "TrainerWorker (pid 48213, 5.60GB)" in line
    assert "7.41GB of 7.77GB" in line


class _Wrapped(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__("actor died")
        self.cause = cause


def test_oom_inside_a_wrapped_actor_error_is_found_and_other_errors_are_not():
    assert "TrainerWorker" in (oom_message(_Wrapped(OutOfMemoryError(RAYLET_TEXT))) or "")
    assert oom_message(ValueError("rollout.n must be >= 2")) is None
