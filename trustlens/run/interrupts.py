"""SIGTERM and SIGINT end open runs as `interrupted`, then the process goes on as it would have.

While at least one writer is open, one handler per signal is installed (from the main thread;
Python runs signal handlers there only). It asks every open writer to write what it was given
and end its run `interrupted` with the signal's name, then does what the previous handler would
have done: the default action (SIGTERM ends the process with that signal), Python's
KeyboardInterrupt for SIGINT, or the program's own handler. Ignored signals stay ignored.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)

_open: dict[int, Callable[[str], None]] = {}  # id -> interrupt(signal name) of an open writer
_previous: dict[int, Any] = {}  # signal -> the handler ours replaced


def watch(key: int, interrupt: Callable[[str], None]) -> None:
    """Call `interrupt(signal name)` on SIGTERM/SIGINT until `unwatch(key)`."""
    _open[key] = interrupt
    if threading.current_thread() is not threading.main_thread():
        return  # handlers can only be installed from the main thread
    for sig in SIGNALS:
        if sig in _previous:
            continue
        current = signal.getsignal(sig)
        if current in (signal.SIG_IGN, None):
            continue
        _previous[sig] = current
        signal.signal(sig, _handle)


def unwatch(key: int) -> None:
    _open.pop(key, None)


def _handle(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    for interrupt in list(_open.values()):
        interrupt(name)
    _open.clear()
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)  # the default action, as without trustlens
    _previous.pop(signum, None)
    os.kill(os.getpid(), signum)
