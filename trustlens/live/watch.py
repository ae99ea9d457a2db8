"""`trustlens watch RUN`: follow a run while it is written and print each alert and doctor finding
once, as it appears.

The run is followed with `trustlens.run.follow.RunFollower` (each poll reads only the part files
written since the last one, never one being written) and each completed step is fed to a
`LiveMonitor`, the collapse alerts and doctor checks computed step by step. A run whose recorder
raised alerts live (`TokenRecorder(alerts=...)`: the run's `alerts` table) has those printed,
marked "live", instead: they are the alerts the training job saw.

`trustlens watch` on a TensorBoard log dir is trustlens.ingest.watch's, which adds it to this
command.

Exit codes:

    0  the run closed (status finished)
    1  an alert or finding reached `--fail-on` (printed first)
    2  bad input: not a run, a run already closed when the watch starts, a bad flag
    3  the run stopped: it closed interrupted or failed, or its writer died (the run says
       `running` but nothing holds it: a released writer lock on a local run, or no change for
       `--stale` seconds on an object store)
    4  its trainer stopped it on a live alert (status stopped, `trustlens train --stop-on`): the
       line names the alert and the checkpoint kept
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TextIO

from trustlens.core.argument_checks import EXIT_ALERT_STOP
from trustlens.core.render import visible_text
from trustlens.live.alert import LiveAlert, from_rows, severity_rank

if TYPE_CHECKING:
    import polars as pl

    from trustlens.live.monitor import LiveMonitor
    from trustlens.run.follow import CompletedStep

# what --fail-on accepts, least severe first; a doctor "problem" counts as critical
FAIL_ON = ("warning", "critical")
# the exit codes (module docstring)
EXIT_CLOSED, EXIT_FAIL_ON, EXIT_STOPPED = 0, 1, 3
# seconds between polls, and of silence after which a run whose lock cannot be asked is stopped
# (trustlens.run.follow.STALE_SECONDS, written out here: this module does not import polars)
DEFAULT_EVERY, DEFAULT_STALE = 1.0, 900.0


def _seconds(text: str) -> float:
    """argparse type of a duration flag: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """Flags of `trustlens watch`."""
    parser.add_argument(
        "run", metavar="RUN", help="a run being written (folder or object-store URL), or a TensorBoard log dir"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line: each alert, finding and the end")
    parser.add_argument("--doctor", action="store_true", help="also the doctor's findings (docs/doctor.md)")
    parser.add_argument(
        "--every", type=_seconds, default=DEFAULT_EVERY, metavar="S", help=f"seconds between polls [{DEFAULT_EVERY:g}]"
    )
    parser.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        default=None,
        metavar="SEVERITY",
        help="exit 1 at the first alert of this severity or worse: warning or critical (a doctor problem is critical)",
    )
    parser.add_argument(
        "--stale",
        type=_seconds,
        default=DEFAULT_STALE,
        metavar="S",
        help="a run on an object store (no writer lock to ask) that has not changed for S seconds is "
        f"taken as stopped [{DEFAULT_STALE:g}]",
    )
    parser.epilog = (
        "Exit codes: 0 the run finished, 1 --fail-on reached, 2 bad input, 3 the run was interrupted, failed or "
        f"its writer died, {EXIT_ALERT_STOP} its trainer stopped it on a live alert (--stop-on)."
    )
    parser.set_defaults(func=_watch)


def alert_line(alert: LiveAlert, *, live: bool) -> str:
    """An alert as one terminal line: step, severity, kind, message, "(live)" for one the recorder
    raised; its text made visible, so that no control character in it acts on the terminal."""
    mark = " (live)" if live else ""
    text = f"step {alert.step:>6}  {alert.severity.upper():<8} {alert.kind:<16} {alert.message}{mark}"
    return visible_text(text)


def alert_json(alert: LiveAlert, *, live: bool) -> dict[str, Any]:
    """An alert as a JSON object: every LiveAlert field (non-finite numbers null), `event`
    (alert, or finding for a doctor check) and `live`."""
    fields = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(alert).items()}
    return {"event": "finding" if alert.source == "doctor" else "alert", **fields, "live": live}


class Printer:
    """Prints each alert once (again only when its severity changes), keeps the status line on a
    terminal, and says whether `--fail-on` was reached."""

    def __init__(self, out: TextIO, status: TextIO | None, *, as_json: bool, fail_on: str | None) -> None:
        self.out, self.status, self.as_json = out, status, as_json
        self.fail_rank = math.inf if fail_on is None else severity_rank(fail_on)
        self.shown: dict[tuple, str] = {}  # LiveAlert.key -> the severity printed
        self.failed = False
        self._status_shown = False

    def alerts(self, alerts: Iterable[LiveAlert], *, live: bool = False) -> None:
        """Print those of `alerts` not printed yet at their severity (`live`: the recorder's)."""
        for alert in alerts:
            if self.shown.get(alert.key) == alert.severity:
                continue
            self.shown[alert.key] = alert.severity
            self._clear_status()
            text = json.dumps(alert_json(alert, live=live)) if self.as_json else alert_line(alert, live=live)
            print(text, file=self.out, flush=True)
            self.failed = self.failed or severity_rank(alert.severity) >= self.fail_rank

    def line(self, text: str, **fields: Any) -> None:
        """A message about the run itself (stopped, closed): text, or a JSON `end` object."""
        self._clear_status()
        if self.as_json:
            print(json.dumps({"event": "end", "message": text, **fields}, default=str), file=self.out, flush=True)
        else:
            print(visible_text(text), file=self.out, flush=True)

    def show_status(self, text: str) -> None:
        """The one-line status, rewritten in place (only on a terminal, not with --json)."""
        if self.status is None or self.as_json:
            return
        self.status.write("\r\x1b[K" + visible_text(text))
        self.status.flush()
        self._status_shown = True

    def _clear_status(self) -> None:
        if self._status_shown and self.status is not None:
            self.status.write("\r\x1b[K")
            self.status.flush()
            self._status_shown = False

    @property
    def counts(self) -> str:
        """'N alerts (C critical)' over the alerts printed so far, and the doctor's findings
        ('F findings (P problems)') when there are any."""
        alerts = [s for (source, *_), s in self.shown.items() if source != "doctor"]
        findings = [s for (source, *_), s in self.shown.items() if source == "doctor"]
        text = f"{_count(len(alerts), 'alert')} ({sum(s == 'critical' for s in alerts)} critical)"
        if findings:
            text += f", {_count(len(findings), 'finding')} ({_count(sum(s == 'problem' for s in findings), 'problem')})"
        return text


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _ago(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.0f} s ago"


def watch(
    path: str | os.PathLike,
    *,
    every: float = DEFAULT_EVERY,
    doctor: bool = False,
    fail_on: str | None = None,
    stale: float = DEFAULT_STALE,
    as_json: bool = False,
    out: TextIO | None = None,
    status: TextIO | None = None,
    sleep: Callable[[float], object] = time.sleep,
) -> int:
    """Follow the run at `path` until it closes, printing to `out` (module docstring); the exit
    code. `status`: where the one-line status goes (a terminal), None for none. Raises
    NotARunError / ValueError (one line) for a path that holds no run or a run already closed."""
    from trustlens.live.doctor import DoctorConfig
    from trustlens.live.monitor import LiveMonitor
    from trustlens.run.follow import RunFollower, updated_seconds_ago, writer_died

    out = sys.stdout if out is None else out
    follower = RunFollower(path)
    state = follower.state
    name = str(follower.path)
    if state.closed:
        raise ValueError(
            f"run {name!r} is already {state.status} (last written {_ago(updated_seconds_ago(state.manifest))}): "
            f"nothing to follow; see its alerts with `trustlens report {name}` or the dashboard"
        )
    printer = Printer(out, status, as_json=as_json, fail_on=fail_on)
    monitor = LiveMonitor(state.manifest, doctor=DoctorConfig() if doctor else None)
    recorded = False  # the run has an alerts table: its recorder raises the collapse alerts live
    suspect = False  # the last check found no writer: checked once more before saying so
    while True:
        update = follower.poll()
        if update.alerts.height:
            recorded = True
            printer.alerts((a for a in from_rows(update.alerts) if doctor or a.source != "doctor"), live=True)
        found = [a for s in update.steps for a in judge(monitor, s)]
        if follower.done:
            found += monitor.finish()
        printer.alerts(a for a in found if not (recorded and a.source == "collapse"))
        if printer.failed:
            printer.line(f"run {name!r}: an alert reached --fail-on {fail_on}", exit=EXIT_FAIL_ON)
            return EXIT_FAIL_ON
        ago = updated_seconds_ago(state.manifest)
        if follower.done:
            if state.status == "finished":
                printer.line(f"run {name!r} finished: {printer.counts}", status=state.status, exit=EXIT_CLOSED)
                return EXIT_CLOSED
            if state.status == "stopped":
                printer.line(
                    f"run {name!r} {stopped_text(state.manifest.get('stopped') or {})}: {printer.counts}",
                    status=state.status,
                    exit=EXIT_ALERT_STOP,
                )
                return EXIT_ALERT_STOP
            error = state.manifest.get("error") or state.manifest.get("signal") or ""
            printer.line(
                f"run {name!r} ended {state.status}{f' ({error})' if error else ''}: {printer.counts}",
                status=state.status,
                exit=EXIT_STOPPED,
            )
            return EXIT_STOPPED
        why = writer_died(follower.path, state.manifest, stale=stale)
        if why is not None:
            if suspect:  # still so after one more poll: not a run that closed between the two looks
                printer.line(
                    f"run {name!r} stopped updating {_ago(ago)}: it still says running but {why} (its writer died?)",
                    status=state.status,
                    exit=EXIT_STOPPED,
                )
                return EXIT_STOPPED
            suspect = True
            continue
        suspect = False
        step = "no steps yet" if state.last_step is None else f"step {state.last_step}"
        printer.show_status(f"{step} · {state.tokens:,} tokens · updated {_ago(ago)} · {printer.counts}")
        sleep(every)


def stopped_text(why: dict[str, Any], run: str | None = None) -> str:
    """What run.json's `stopped` says, in words: 'stopped after step S on a critical KIND (evidence
    from step E); kept checkpoints/step-… (held-out accuracy A)', the folder under `run` if given."""
    alert = why.get("alert") or {}
    kept = why.get("checkpoint")
    if kept and run is not None:
        kept = f"{run.rstrip('/')}/{kept}"
    accuracy = why.get("checkpoint_accuracy")
    weights = f"kept {kept}" if kept else "no checkpoint from before it was kept"
    if kept and accuracy is not None:
        weights += f" (held-out accuracy {accuracy:.3f})"
    start = why.get("evidence_start_step", alert.get("step"))
    return (
        f"stopped after step {why.get('step')} (--stop-on {why.get('on')}) on a {alert.get('severity')} "
        f"{alert.get('kind')} (evidence from step {start}); {weights}"
    )


def judge(monitor: LiveMonitor, step: CompletedStep) -> list[LiveAlert]:
    """`monitor.update` on a completed step's rows (a table without rows passed as None)."""

    def rows(frame: pl.DataFrame) -> pl.DataFrame | None:
        return None if frame.is_empty() else frame

    return monitor.update(
        step.step,
        tokens=rows(step.tokens),
        samples=rows(step.samples),
        metrics=rows(step.metrics),
        aggregates=rows(step.aggregates),
    )


def watch_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """`watch`'s keywords from the parsed flags of `trustlens watch` (the status line on a terminal)."""
    return {
        "every": args.every,
        "doctor": args.doctor,
        "fail_on": args.fail_on,
        "stale": args.stale,
        "as_json": args.json,
        "status": sys.stderr if sys.stderr.isatty() else None,
    }


def _watch(args: argparse.Namespace) -> int:
    return watch(args.run, **watch_arguments(args))


__all__ = ["Printer", "alert_json", "alert_line", "configure", "judge", "stopped_text", "watch", "watch_arguments"]
