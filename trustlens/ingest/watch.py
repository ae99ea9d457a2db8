"""`trustlens watch` on a TensorBoard log dir: the run-following command of trustlens.live.watch,
plus the log dirs that `trustlens import` reads.

A log dir (event files, no run.json) is followed by `EventFollower` (trustlens.ingest.follow):
its new event records only, each complete step's metrics judged by a `LiveMonitor` as
`trustlens import` judges the finished dir, each alert printed once by the run watcher's
`Printer`. A log dir has no status, so one not written for `--stale` seconds is taken as
finished (exit 0). Any other path is the run watcher's (its exit codes: trustlens.live.watch).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from trustlens.ingest.follow import EventFollower, is_event_dir
from trustlens.live import watch as run_watch
from trustlens.live.monitor import LiveMonitor
from trustlens.live.watch import DEFAULT_EVERY, DEFAULT_STALE, EXIT_CLOSED, EXIT_FAIL_ON, Printer


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """Flags of `trustlens watch`: the run watcher's, and `--framework` for a log dir."""
    run_watch.configure(name, parser)
    parser.add_argument(
        "--framework",
        default=None,
        metavar="NAME",
        help="a TensorBoard log dir's framework, when its names do not tell (as trustlens import --framework)",
    )
    parser.set_defaults(func=_watch)


def watch(path: str | os.PathLike, *, framework: str | None = None, doctor: bool = False, **kwargs: Any) -> int:
    """Follow `path` until it closes: a TensorBoard log dir by `watch_events` (`framework` as
    `trustlens import --framework`), a run by trustlens.live.watch.watch (`doctor` is a run's
    only: a log dir has no tokens); `kwargs` are the two's shared keywords. The exit code."""
    if is_event_dir(path):
        return watch_events(path, framework=framework, **kwargs)
    return run_watch.watch(path, doctor=doctor, **kwargs)


def watch_events(
    path: str | os.PathLike,
    *,
    every: float = DEFAULT_EVERY,
    fail_on: str | None = None,
    stale: float = DEFAULT_STALE,
    as_json: bool = False,
    out: TextIO | None = None,
    status: TextIO | None = None,
    sleep: Callable[[float], object] = time.sleep,
    framework: str | None = None,
) -> int:
    """Follow a TensorBoard log dir while it is written (trustlens.ingest.follow): each complete
    step's metrics judged as `trustlens import` judges the finished dir, each alert printed once.
    A log has no status: one not written for `stale` seconds is taken as finished (exit 0)."""

    out = sys.stdout if out is None else out
    follower = EventFollower(path, framework=framework)
    printer = Printer(out, status, as_json=as_json, fail_on=fail_on)
    monitor: LiveMonitor | None = None
    name = str(path)
    quiet_since = time.monotonic()
    while True:
        steps = follower.poll()
        if steps:
            quiet_since = time.monotonic()
        idle = time.monotonic() - quiet_since >= stale
        if idle:
            steps += follower.poll(finish=True)
        for step, rows in steps:
            if monitor is None:
                assert follower.manifest is not None
                monitor = LiveMonitor(follower.manifest, doctor=None)
            printer.alerts(monitor.update(step, metrics=rows))
        if idle and monitor is not None:
            printer.alerts(monitor.finish())
        if printer.failed:
            printer.line(f"log dir {name!r}: an alert reached --fail-on {fail_on}", exit=EXIT_FAIL_ON)
            return EXIT_FAIL_ON
        if idle:
            printer.line(
                f"log dir {name!r} not written for {stale:g} s, taken as finished: {printer.counts}", exit=EXIT_CLOSED
            )
            return EXIT_CLOSED
        last = "no steps yet" if follower.last_step is None else f"step {follower.last_step}"
        printer.show_status(f"{last} · {printer.counts}")
        sleep(every)


def _watch(args: argparse.Namespace) -> int:
    return watch(args.run, framework=args.framework, **run_watch.watch_arguments(args))


__all__ = ["configure", "watch", "watch_events"]
