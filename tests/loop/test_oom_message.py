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


RAY_2_5X_TEXT = (
    "3 worker(s) were killed due to the node running low on memory. Memory on the node (IP: "
    "192.0.2.2, ID: 24b3) was 22.83GB used / 23.54GB limit (0.970041)\n"
    "OOM kill reason: Memory usage 24049917952B exceeded threshold of 24012257280B\n"
    "Ray killed 3 worker(s) based on the killing policy\nConsidered workers: [\n"
    "Selected to kill: (Actor(a0f6): job ID=01000000, lease ID=0200, task "
    "name=RewardWorker.__init__, required resources={}, pid=15678, actual memory used=0.07GB, "
    "worker ID=e539)\n"
    "Selected to kill: (Actor(e4ba): job ID=01000000, lease ID=0000, task "
    "name=TrainerWorker.__init__, required resources={}, pid=15556, actual memory used=4.16GB, "
    "worker ID=bb87)\n"
    "Top 10 memory users: PID\tMEM(GB)\tCOMMAND\n15556\t4.16\tray::TrainerWorker.logprobs\n"
)


def test_ray_2_5x_kill_report_names_every_killed_actor_in_one_line():
    line = oom_message(OutOfMemoryError(RAY_2_5X_TEXT))
    assert line is not None and "\n" not in line
    assert "RewardWorker (pid 15678, 0.07GB), TrainerWorker (pid 15556, 4.16GB)" in line
    assert "22.83GB of 23.54GB" in line


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
