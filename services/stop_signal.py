"""Graceful Ctrl-C: the first SIGINT/SIGTERM asks the run to stop after the current step (with a
checkpoint, like ``fp8rl runs stop``); a second one stops at once (``KeyboardInterrupt``).

Ray's own processes block SIGINT, so a Ctrl-C in the terminal reaches only the driver, which
finishes the step it is in, saves, and shuts the workers down in order.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnSignal:
    """Context manager installing the two-stage handler on SIGINT and SIGTERM.

    ``requested`` turns True at the first signal, ``signum`` is that signal's number. The
    previous handlers are restored on exit.
    A signal the process inherited as ignored (``SIG_IGN``) stays ignored.
    Outside the main thread (where Python cannot install handlers) it does nothing and
    ``requested`` stays False.
    """

    def __init__(self, what_next: str = "") -> None:
        self.requested = False
        self.signum: int | None = None
        self.what_next = what_next
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                if signal.getsignal(sig) is signal.SIG_IGN:  # ignored on purpose by the parent
                    continue  # (e.g. `cmd &` in a script): like Python, leave it ignored
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested:
            log.warning("%s again: stopping now, without a checkpoint", name)
            raise KeyboardInterrupt
        self.requested, self.signum = True, signum
        log.warning(
            "%s: stopping after the current step and saving a checkpoint%s "
            "(press Ctrl-C again to stop at once, without one)",
            name,
            f"; {self.what_next}" if self.what_next else "",
        )
