"""`LiveMonitor`: the collapse alerts and the doctor's findings of a run, one completed step at a
time (the package docstring of trustlens.live says what it guarantees)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import polars as pl

from trustlens.analysis.buckets import in_memory
from trustlens.analysis.collapse.config import CollapseConfig
from trustlens.analysis.collapse.detect import alert_row, episode_record, rollout_lag
from trustlens.analysis.collapse.heldout import eval_size
from trustlens.analysis.collapse.levels import model_kind
from trustlens.analysis.collapse.signals import step_signals
from trustlens.analysis.collapse.steps import CollapseSteps, Episode, planned_window, warmup_steps
from trustlens.analysis.diagnosis.finding import Finding
from trustlens.analysis.diagnosis.registry import get
from trustlens.core.argument_checks import check_int, check_type
from trustlens.live.alert import LiveAlert
from trustlens.live.doctor import DoctorConfig, LiveDoctor
from trustlens.live.rows import ROW_TABLES, MemoryRun, Rows, as_frame
from trustlens.run.reader import Run


class LiveMonitor:
    """Feed it each completed step's rows (`update`), in step order; it returns the alerts that
    are new or changed at that step.

    manifest: the run's run.json (rules, active_rule, config: rollout_lag and the planned steps,
        model_kind, sampling, keep), as the writer holds it.
    collapse: the collapse detectors' thresholds (None: no collapse alerts).
    doctor: when the doctor's checks run (None: no doctor findings).
    rule: the rule whose block rate is watched (default: run.json's active_rule; none: every rule).
    rank: the rank of rows that come without a `rank` column.
    """

    def __init__(
        self,
        manifest: Mapping[str, Any],
        collapse: CollapseConfig | None = CollapseConfig(),
        *,
        doctor: DoctorConfig | None = DoctorConfig(),
        rule: str | None = None,
        rank: int = 0,
    ) -> None:
        check_type("manifest", manifest, Mapping, "run.json as a mapping (Run.manifest)")
        if collapse is not None:
            check_type("collapse", collapse, CollapseConfig, "a CollapseConfig or None")
        if doctor is not None:
            check_type("doctor", doctor, DoctorConfig, "a trustlens.live.DoctorConfig or None")
        self.rank = check_int("rank", rank, low=0)
        self.manifest = dict(manifest)
        self.collapse, self._run = collapse, MemoryRun.of(self.manifest, {})
        self.rule = rule if rule is not None else self._run.active_rule
        self.rules = list(self._run.rules)
        self._detectors: CollapseSteps | None = None  # made at the first step with signals
        self._doctor = None if doctor is None else LiveDoctor(self.manifest, doctor)
        self._alerts: dict[tuple, LiveAlert] = {}  # key -> the alert as last raised or changed
        self._episodes: dict[int, tuple] = {}  # id(episode) -> its alert's key
        self._doctor_steps: dict[str, int] = {}  # check -> the step it was first raised at
        self.last_step: int | None = None

    @classmethod
    def for_run(cls, run: Run, collapse: CollapseConfig | None = CollapseConfig(), **kwargs: Any) -> LiveMonitor:
        """A monitor of `run` (a Run: its run.json)."""
        check_type("run", run, Run, "a Run (trustlens.load_run)")
        return cls(run.manifest, collapse, **kwargs)

    @property
    def alerts(self) -> list[LiveAlert]:
        """Every alert so far as last raised or changed, by step then kind."""
        return sorted(self._alerts.values(), key=lambda a: (a.step, a.kind, a.signal or ""))

    def update(
        self,
        step: int,
        *,
        tokens: Rows | None = None,
        samples: Rows | None = None,
        metrics: Rows | None = None,
        aggregates: Rows | None = None,
        wall_time: float | None = None,
    ) -> list[LiveAlert]:
        """Judge the completed `step` from its rows (each a polars or Arrow table shaped as the
        run's table of that name; None: no rows); the alerts new or changed at it, raised at
        `wall_time` (Unix seconds; default now). Steps must come in increasing order."""
        step = check_int("step", step, low=0)
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"step must come after the last step judged ({self.last_step}), got {step}")
        self.last_step = step
        wall = time.time() if wall_time is None else float(wall_time)
        given = {"tokens": tokens, "samples": samples, "metrics": metrics, "aggregates": aggregates}
        frames = {t: as_frame(t, given[t], self.rules, self.rank) for t in ROW_TABLES}
        run = MemoryRun.of(self.manifest, frames)
        with in_memory():  # a step's rows: polars' streaming engine would cost more than the work
            out = [] if self.collapse is None else self._collapse_step(step, run, wall)
            if self._doctor is not None:
                out += [self._finding(step, f, wall) for f in self._doctor.push(frames["tokens"])]
        return out

    def finish(self, wall_time: float | None = None) -> list[LiveAlert]:
        """The run ended: every provisional collapse alert is final, and the doctor's accumulating
        checks judge the run's last steps (the alerts changed or new)."""
        wall = time.time() if wall_time is None else float(wall_time)
        out = [] if self._detectors is None else [self._final(ep, wall) for ep in self._detectors.finish()]
        if self._doctor is not None and self.last_step is not None:
            with in_memory():
                out += [self._finding(self.last_step, f, wall) for f in self._doctor.finish()]
        return out

    def _collapse_step(self, step: int, run: MemoryRun, wall: float) -> list[LiveAlert]:
        assert self.collapse is not None
        watched = [self.rule] if self.rule is not None and self.rule in self.rules else None
        signals = step_signals(run, watched)  # blocked_drift watches the active rule alone
        if signals.is_empty():
            return []
        if self._detectors is None:
            cfg = self.collapse
            start = cfg.baseline_start if cfg.baseline_start is not None else rollout_lag(run)
            window = planned_window(self.manifest)
            self._detectors = CollapseSteps(
                cfg,
                signals.columns,
                self.rule,
                start,
                model_kind(run),
                window,
                warmup=warmup_steps(self.manifest),
                eval_size=eval_size(self.manifest),
                keep=False,
            )
        row = signals.row(0, named=True)
        out = []
        for ep in self._detectors.push(step, row):
            key = self._episodes.get(id(ep))
            if key is None:
                out.append(self._raise(ep, run, step, wall))
            else:
                out.append(self._change(key, ep, step, wall, provisional=True))
        return out + [self._final(ep, wall) for ep in self._detectors.closed()]

    def _raise(self, ep: Episode, run: MemoryRun, step: int, wall: float) -> LiveAlert:
        """A new episode: its alert, with its drivers read from this step's rows."""
        assert self.collapse is not None
        alert = LiveAlert.from_record(
            alert_row(run, ep, self.collapse),
            source="collapse",
            raised_at_step=step,
            raised_wall_time=wall,
            provisional=True,
        )
        self._episodes[id(ep)] = alert.key  # the episode stays open (alive) until `_final`
        self._alerts[alert.key] = alert
        return alert

    def _change(self, key: tuple, ep: Episode, step: int, wall: float, *, provisional: bool) -> LiveAlert:
        alert = LiveAlert.from_record(
            {**self._alerts[key].record(), **episode_record(ep)},
            source="collapse",
            raised_at_step=step,
            raised_wall_time=wall,
            provisional=provisional,
        )
        self._alerts[key] = alert
        return alert

    def _final(self, ep: Episode, wall: float) -> LiveAlert:
        key = self._episodes.pop(id(ep))
        return self._change(
            key, ep, self.last_step if self.last_step is not None else ep.end_step, wall, provisional=False
        )

    def _finding(self, step: int, f: Finding, wall: float) -> LiveAlert:
        first = self._doctor_steps.setdefault(f.check, step)
        fix = f" Fix: {f.fix}" if f.fix else ""
        examples = f.evidence.get("examples", []) if isinstance(f.evidence, dict) else []
        drivers = tuple(
            {"sample": int(e["sample"]), "update": int(e.get("update", 0)), "pos": int(e["pos"])}
            for e in examples
            if isinstance(e, dict) and {"sample", "pos"} <= e.keys()
        )
        alert = LiveAlert(
            kind=f.check,
            step=first,
            severity=f.verdict,
            message=f"{f.summary}.{fix}" if not f.summary.endswith(".") else f"{f.summary}{fix}",
            source="doctor",
            raised_at_step=step,
            raised_wall_time=wall,
            provisional=get(f.check).cadence != "early",
            end_step=step,
            samples=tuple(dict.fromkeys(d["sample"] for d in drivers)),
            drivers=drivers,
        )
        self._alerts[alert.key] = alert
        return alert


def step_frames(run: Run) -> Iterator[tuple[int, dict[str, pl.DataFrame]]]:
    """(step, {table: its rows at the step}) of every step of a recorded run, in step order: the
    run as a live monitor would have been fed it."""
    check_type("run", run, Run, "a Run (trustlens.load_run)")
    tables: dict[str, dict[int, pl.DataFrame]] = {}
    for table in ROW_TABLES:
        if table == "tokens" and not run.parts.get("tokens"):
            continue
        frame = getattr(run, table).collect()
        tables[table] = {int(k[0]): v for k, v in frame.partition_by("step", as_dict=True).items()}
    steps = sorted({s for parts in tables.values() for s in parts})
    for step in steps:
        yield step, {t: parts[step] for t, parts in tables.items() if step in parts}


def replay(run: Run, monitor: LiveMonitor | None = None) -> Iterator[tuple[int, list[LiveAlert]]]:
    """Feed a recorded run to `monitor` (default: `LiveMonitor.for_run(run)`) step by step:
    (step, the alerts new or changed at it) per step, then (the last step, the alerts `finish`
    made final)."""
    monitor = LiveMonitor.for_run(run) if monitor is None else monitor
    last = -1
    for step, frames in step_frames(run):
        yield step, monitor.update(step, **frames)  # type: ignore[arg-type]
        last = step
    yield last, monitor.finish()


__all__ = ["LiveMonitor", "replay", "step_frames"]
