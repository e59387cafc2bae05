"""Child process of ``SubprocessPool``: calls one function per JSON line read from stdin.

Run as ``python -m fp8rl.workers.reward.verifier_child module:function``. After importing it writes
``{"ready": true}``; each request line is ``{"kwargs": {...}}``; each reply line is ``{"value": float}`` or ``{"error": "..."}``. The child
runs on its own main thread, so libraries that use ``signal.alarm`` (math-verify) work here
even when the parent is a Ray actor thread. It exits when stdin closes (the parent died).
"""

from __future__ import annotations

import importlib
import json
import sys


def main() -> None:
    """Serve requests for the function named in ``sys.argv[1]`` until stdin closes."""
    module_name, _, attr = sys.argv[1].partition(":")
    fn = getattr(importlib.import_module(module_name), attr)
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints from the function must not corrupt the replies
    out.write(json.dumps({"ready": True}) + "\n")  # imports done: the parent starts its clock
    out.flush()
    for line in sys.stdin:
        try:
            reply = {"value": float(fn(**json.loads(line)["kwargs"]))}
        except Exception as error:  # reported to the parent, which decides
            reply = {"error": f"{type(error).__name__}: {error}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
