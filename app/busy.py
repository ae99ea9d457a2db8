"""At most RUNNING_AT_ONCE page runs compute at once; the others say that the dashboard is busy
and wait their turn.

Streamlit runs each browser tab's script in a thread of one process. Eight tabs opened at once
on a loaded machine then share its cores eight ways (and the GIL with the server's event loop,
which answers the health check and sends every page): every page finishes late, and meanwhile
shows nothing. With a bounded number of runs computing, the first pages finish first, those
waiting show a "busy" note at once (updated every WAIT_SECONDS, which also lets a run the user
left stop waiting), and the server keeps answering. docs/dashboard.md gives the measured times.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st

# Environment variable that sets how many page runs compute at once (a number ≥ 1).
AT_ONCE_ENV = "TRUSTLENS_PAGES_AT_ONCE"


def _at_once() -> int:
    """Page runs computing at once: $TRUSTLENS_PAGES_AT_ONCE, else one per core, at least two."""
    try:
        return max(1, int(os.environ[AT_ONCE_ENV]))
    except (KeyError, ValueError):
        return max(2, os.cpu_count() or 2)


RUNNING_AT_ONCE = _at_once()
# Seconds between two updates of a waiting page's note.
WAIT_SECONDS = 0.5

_slots = threading.BoundedSemaphore(RUNNING_AT_ONCE)
_count = threading.Lock()
_waiting = 0  # page runs waiting for a slot now


def waiting() -> int:
    """Page runs waiting for their turn now."""
    return _waiting


@contextmanager
def in_turn() -> Iterator[None]:
    """Run the block once fewer than RUNNING_AT_ONCE other page runs compute; until then the page
    shows a note saying the dashboard is busy (removed when the block starts)."""
    global _waiting
    if _slots.acquire(blocking=False):
        try:
            yield
        finally:
            _slots.release()
        return
    note = st.empty()
    with _count:
        _waiting += 1
    try:
        while not _slots.acquire(timeout=WAIT_SECONDS):
            # a call that sends to the page: it also raises when the tab asked for another run
            note.info(
                f"The dashboard is busy: {RUNNING_AT_ONCE} pages are being computed and {_waiting} wait, this one "
                "among them. It loads in its turn; nothing needs to be done.",
                icon=":material/hourglass_top:",
            )
    finally:
        with _count:
            _waiting -= 1
    try:
        note.empty()
        yield
    finally:
        _slots.release()
