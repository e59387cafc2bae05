"""Run a scoring function in child processes with an outer wall-clock timeout.

Why: math-verify bounds its own parsing/verification time with ``signal.alarm``, which only
works on the main thread; inside a Ray actor (or any worker thread) it raises or cannot fire,
and a pathological answer can hang sympy forever. Here each child is a plain Python process
(``verifier_child.py``) that we start ourselves and talk to over pipes with JSON lines. A call
that exceeds the timeout kills that child (by its own pid, we started it), scores 0 and is
counted as timed out; a fresh child replaces it. No ``multiprocessing`` (its spawn/fork modes
re-import the parent's ``__main__`` or fork a threaded process).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CallResult:
    """One call's outcome: ``value`` (0.0 on timeout or error), ``timed_out``, ``error`` text or None."""

    value: float
    timed_out: bool = False
    error: str | None = None


STARTUP_TIMEOUT_S = 120.0
"""How long a child may take to import its target before the first call (not the call timeout)."""


class _Child:
    def __init__(self, target: str, env: dict[str, str]) -> None:
        self.ready = False
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fp8rl.workers.reward.verifier_child", target],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.replies: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.replies.put(line)
        self.replies.put(None)  # EOF: the child exited

    def call(self, kwargs: dict[str, Any], timeout_s: float) -> CallResult:
        assert self.proc.stdin is not None
        if not self.ready:
            try:
                first = self.replies.get(timeout=STARTUP_TIMEOUT_S)
            except queue.Empty:
                return CallResult(0.0, error=f"child did not start within {STARTUP_TIMEOUT_S} s")
            if first is None:
                return CallResult(
                    0.0, error=f"child failed to start (exit code {self.proc.wait()})"
                )
            self.ready = True
        try:
            self.proc.stdin.write(json.dumps({"kwargs": kwargs}) + "\n")
            self.proc.stdin.flush()
            line = self.replies.get(timeout=timeout_s)
        except queue.Empty:
            return CallResult(0.0, timed_out=True)
        except (BrokenPipeError, OSError) as error:
            return CallResult(0.0, error=f"child process died: {error}")
        if line is None:
            return CallResult(0.0, error=f"child process exited with code {self.proc.wait()}")
        reply = json.loads(line)
        if "error" in reply:
            return CallResult(0.0, error=reply["error"])
        return CallResult(reply["value"])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class SubprocessPool:
    """``num_processes`` children serving ``target`` (``"package.module:function"``).

    ``map(list_of_kwargs)`` returns one ``CallResult`` per item, in order; each call is bounded
    by ``timeout_s`` seconds of wall time (a timed-out child is killed and replaced).
    ``pythonpath``: extra import roots for the children. Thread-safe; ``close()`` stops the
    children (also at garbage collection).
    """

    def __init__(
        self,
        target: str,
        *,
        num_processes: int = 1,
        timeout_s: float,
        pythonpath: Sequence[str] = (),
    ) -> None:
        if num_processes < 1:
            raise ValueError(f"num_processes must be >= 1, got {num_processes}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.target, self.timeout_s = target, timeout_s
        self._env = dict(os.environ)
        if pythonpath:
            parts = [*pythonpath, self._env.get("PYTHONPATH", "")]
            self._env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
        self._idle: queue.Queue[_Child] = queue.Queue()
        self._children = [_Child(target, self._env) for _ in range(num_processes)]
        for child in self._children:
            self._idle.put(child)
        self._executor = ThreadPoolExecutor(max_workers=num_processes)
        self._lock = threading.Lock()

    def _call(self, kwargs: dict[str, Any]) -> CallResult:
        child = self._idle.get()
        try:
            result = child.call(kwargs, self.timeout_s)
            if result.timed_out or not child.alive():
                child = self._replace(child)
            return result
        finally:
            self._idle.put(child)

    def _replace(self, child: _Child) -> _Child:
        child.kill()
        fresh = _Child(self.target, self._env)
        with self._lock:
            self._children[self._children.index(child)] = fresh
        return fresh

    def map(self, items: Sequence[dict[str, Any]]) -> list[CallResult]:
        """Call the target once per kwargs dict; results in input order."""
        return list(self._executor.map(self._call, items))

    def close(self) -> None:
        """Kill the children and stop the threads (idempotent)."""
        self._executor.shutdown(wait=True)
        with self._lock:
            for child in self._children:
                child.kill()
            self._children = []

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
