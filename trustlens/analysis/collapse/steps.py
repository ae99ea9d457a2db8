"""The collapse detectors (`trustlens.analysis.collapse.detectors.DETECTORS`), fed one step at a time.

`CollapseSteps` takes the rows of `step_signals` one by one, in step order (`push`), and keeps
the alerts (`Episode`) they make. Both `detect_collapse` (every row of a finished run) and the
live monitor (`trustlens.live`, each step as it completes) run it, so an alert raised live is the
alert found on the finished run, step by step.

The baseline follows the run. Each step detector keeps a trailing robust baseline: the median m
and the scale s = max(1.4826 · MAD, rel_floor·|m|) of the latest `reference_steps` of its values
that were judged healthy (a flagged row, or a row while its episode is open, never joins it:
the baseline holds still while a change lasts). The reward is measured from the highest
baseline median it had (its peak level): a collapse after learning is a fall from what the run
reached, however slowly it comes. Steps of the learning-rate warm-up
(`warmup_steps`) never join the baseline of a signal the learning rate sets (entropy, mismatch,
gradient norm, block rate) and are not judged there, and the π-vs-μ signals start at the
engine's lag (`baseline_start`); the outcome (reward, held-out accuracy) is judged from the first
step: a run can fall during its warm-up. A step is judged once `baseline_steps` values are in. So a slow
healthy trend moves the baseline with it, and a change faster than the window is a change.

A relative factor never has a zero base: x̄/m is taken with m floored at the detector's
`min_abs` (blocked_drift: 0.01, entropy: 0.01 nats, reward: 0.05), and a falling signal whose
baseline is below its floor has nothing to fall from.

A step detector's episode opens once `confirm_steps` judged rows in a row are flagged (one noisy
row is not a change; the episode's step is the first of them, its alert is raised at the last)
and lasts as long as its condition holds: it ends after
`merge_gap` rows with none; held-out accuracy's episode lasts while its evaluations stay below
the line, however far apart they are, and ends at the first one back above it. Only an outcome
turns critical (a reward_drop whose r̄ fell, by z_critical standard errors of r̄; an
accuracy_drop confirmed by `accuracy_evals` evaluations in a row below the line, which with
`eval_size` is z_accuracy binomial standard errors and accuracy_min_drop below the baseline: one
evaluation below it alone raises nothing). An accuracy_drop begins where its fall began: the
first evaluation of the lower CUSUM's excursion (Page's change-point estimate, `AccuracyFall`)
or of the evaluations below the line, whichever is earlier. The other detectors warn, and the
warnings that ended at most `evidence_steps` rows before an outcome alert opened are its
evidence: `evidence` lists their kinds and `evidence_start_step` is the first flagged step among
them and it.

State: each detector's trailing baseline and windows and the open episodes: bounded by the
configuration's windows, never by the run's length.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from trustlens.analysis.collapse.config import ALERT_WINDOW_MAX, REWARD_WINDOW_MAX, CollapseConfig, alert_window
from trustlens.analysis.collapse.detectors import DETECTORS, Detector, alert_kind, past
from trustlens.analysis.collapse.heldout import AccuracyFall
from trustlens.analysis.collapse.levels import Learning, MismatchLevel, Trailing
from trustlens.run import blocked_column


def planned_window(manifest: dict | None) -> int:
    """Steps of the alerts' first baseline and merge gap for a run with this run.json: the
    alert_window of its planned steps (`planned_steps`, or the built-in trainer's `config.steps`),
    ALERT_WINDOW_MAX when it names none. Known before the run ends, so that a live run and the
    finished run judge every step alike."""
    manifest = manifest or {}
    planned = manifest.get("planned_steps") or (manifest.get("config") or {}).get("steps")
    if isinstance(planned, int) and not isinstance(planned, bool) and planned > 0:
        return alert_window(planned)
    return ALERT_WINDOW_MAX


def warmup_steps(manifest: dict | None) -> int:
    """The learning-rate warm-up steps run.json names (`warmup_steps`, or the built-in trainer's
    `config.warmup_steps`); 0 when it names none."""
    manifest = manifest or {}
    steps = manifest.get("warmup_steps", (manifest.get("config") or {}).get("warmup_steps"))
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else 0


@dataclass
class Episode:
    """One alert: the flagged rows of one detector while its condition holds (the columns of
    ALERT_SCHEMA but the drivers and the message)."""

    detector: str  # the registered detector (DETECTORS)
    signal: str
    step: int  # first flagged step
    end_step: int  # last flagged step so far
    value: float  # x̄ at the most extreme step (a critical reward_drop step: r̄)
    baseline: float  # the baseline median m at the first step
    z: float  # robust z at the most extreme step (NaN for accuracy_drop)
    critical_step: int | None  # first critical step
    info: bool  # every step so far came while the run learned (an entropy alert)
    end_row: int = field(repr=False)  # row (in step order) of end_step
    opened_step: int = -1  # the step whose row confirmed it (its drivers are read there; -1: `step`)
    evidence_start_step: int = -1  # first flagged step of it and of its evidence (-1: `step`)
    evidence: tuple[str, ...] = ()  # the kinds of the warnings before it that are its evidence
    done: bool = field(default=False, repr=False)  # its condition stopped holding (accuracy: an evaluation above)

    def __post_init__(self) -> None:
        if self.evidence_start_step < 0:
            self.evidence_start_step = self.step
        if self.opened_step < 0:
            self.opened_step = self.step

    @property
    def kind(self) -> str:
        return alert_kind(self.detector)

    @property
    def severity(self) -> str:
        return "critical" if self.critical_step is not None else "info" if self.info else "warning"


def _extremity(z: float, value: float, baseline: float) -> float:
    """How far a flagged step is from its baseline: |z|, or |value − baseline| where z is NaN."""
    return abs(z) if math.isfinite(z) else abs(value - baseline)


class _Judge:
    """One step detector's state: its trailing baseline values and its windows."""

    def __init__(self, d: Detector, signal: str, cfg: CollapseConfig, n_base: int, n_reward: int) -> None:
        self.d, self.signal, self.cfg, self.n_base = d, signal, cfg, n_base
        self.floor = d.min_abs(cfg)
        self.reference: deque[float] = deque(maxlen=max(cfg.reference_steps, n_base))
        self.smoothed = Trailing(d.smooth(cfg))
        self.window = Trailing(n_reward)
        self.base: tuple[float, float] = (math.nan, math.nan)  # (m, s) the last judged row was judged on
        self.peak = -math.inf  # an outcome's highest baseline median so far: a fall is measured from it
        self.streak = 0  # judged rows in a row flagged, up to this one
        self.streak_start = -1  # the step of the first of them
        self.streak_info = True  # every row of the streak came while the run learned

    def _baseline(self) -> tuple[float, float] | None:
        if len(self.reference) < self.n_base:
            return None
        ref = np.asarray(self.reference, dtype=np.float64)
        m = float(np.median(ref))
        s = 1.4826 * float(np.median(np.abs(ref - m)))
        if self.d.test == "outcome":
            self.peak = m = max(self.peak, m)
        return m, max(s, self.cfg.rel_floor * abs(m), 1e-12)

    def push(self, x: float, counts: bool, holding: bool) -> tuple[bool, bool, float, float] | None:
        """(flagged, critical, value, z) of this row, or None when it is not judged. `counts`:
        past the warm-up and the engine's lag; `holding`: the detector's episode is open (the
        row does not join the baseline)."""
        self.smoothed.push(x)
        self.window.push(x)
        if not counts or not math.isfinite(x):
            return None
        base = self._baseline()
        judged = None if base is None else self._judge(*base)
        if judged is None or not (judged[0] or judged[1] or holding):
            self.reference.append(x)
        return judged

    def _spread(self, s: float) -> float:
        """The standard deviation of the baseline's values within 4·s of their median, at least
        s: the MAD is coarse on a signal of a few levels (a reward of 16 0/1 samples a step
        moves in steps of 1/16), and a value 4·s out is not the baseline's noise."""
        ref = np.asarray(self.reference, dtype=np.float64)
        inside = ref[np.abs(ref - np.median(ref)) <= 4 * s]
        return max(s, float(np.std(inside)) if len(inside) else 0.0)

    def _judge(self, m: float, s: float) -> tuple[bool, bool, float, float] | None:
        d, cfg = self.d, self.cfg
        if not d.up and m < self.floor:  # nothing to fall from
            return None
        self.base = m, s
        v = self.smoothed.stat(np.median)
        z = (v - m) / s
        flagged = abs(z) > cfg.z_warning and past(d, v, m, d.factor(cfg), self.floor)
        critical = False
        if d.critical is not None:  # r̄ past the critical factor, and |r̄ − m| > z_critical standard errors
            mean = self.window.stat(np.mean)
            error = self._spread(s) / math.sqrt(max(1, len(self.window.values)))
            critical = past(d, mean, m, d.critical(cfg), self.floor) and abs(mean - m) > cfg.z_critical * error
            if critical:
                v, z = mean, (mean - m) / s
        return flagged, critical, v, z


class CollapseSteps:
    """The collapse detectors over rows of step_signals pushed one by one in step order (module
    docstring). `columns`: the signal columns the rows have; `rule`: the watched active rule
    (None: every blocked_<rule> column); `start`: the first step of the π-vs-μ baselines; `kind`:
    the run's model kind; `window`: the first baseline's steps and merge gap where the config
    leaves them None (`planned_window`); `warmup`: the learning-rate warm-up steps where the
    config leaves them None (`warmup_steps`); `keep`: keep every episode in `episodes` (a
    finished run's list; a live monitor keeps only the open ones)."""

    def __init__(
        self,
        cfg: CollapseConfig,
        columns: list[str],
        rule: str | None,
        start: int,
        kind: str,
        window: int,
        *,
        warmup: int = 0,
        eval_size: int | None = None,
        keep: bool = True,
    ) -> None:
        self.cfg = cfg
        n_base = cfg.baseline_steps if cfg.baseline_steps is not None else window
        n_reward = cfg.reward_window if cfg.reward_window is not None else min(REWARD_WINDOW_MAX, n_base)
        self.gap = cfg.merge_gap if cfg.merge_gap is not None else window
        self.evidence_rows = cfg.evidence_rows
        self.warmup = cfg.warmup_steps if cfg.warmup_steps is not None else warmup
        self.start = max(start, self.warmup)
        watched = [blocked_column(rule)] if rule is not None else [c for c in columns if c.startswith("blocked_")]
        self.judges: list[_Judge] = []
        for d in DETECTORS.values():
            if d.test == "evaluations":
                continue
            for signal in [c for c in watched if c in columns] if d.signal == "blocked_*" else [d.signal]:
                if signal in columns:
                    self.judges.append(_Judge(d, signal, cfg, n_base, n_reward))
        self.mismatch = MismatchLevel(kind, cfg.smooth, cfg.mismatch_k3_level)
        self.learning = Learning(n_base, n_reward)
        n = cfg.eval_size if cfg.eval_size is not None else eval_size
        self.evaluations = AccuracyFall(cfg, n) if "accuracy" in columns else None
        self.row = -1
        self.keep = keep
        self.episodes: list[Episode] = []  # with keep: every episode so far, in the order they opened
        self.open: dict[tuple[str, str], Episode] = {}
        self.warnings: deque[Episode] = deque()  # final warnings that may still be a critical alert's evidence
        self.final: list[Episode] = []  # episodes final since `closed` was last asked

    def push(self, step: int, row: dict[str, float | None]) -> list[Episode]:
        """Judge the row of `step` (signal → value, None or NaN where absent); the episodes it
        opened or changed."""
        self.row += 1

        def value(name: str) -> float:
            v = row.get(name)
            return math.nan if v is None else float(v)

        mismatch_level = self.mismatch.push(value("k3_kl"), value("prob_diff_mean"))
        learning = self.learning.push(value("accuracy"), value("reward"))
        flags: list[tuple[Detector, str, int, float, float, float, bool, bool]] = []
        for judge in self.judges:
            d = judge.d
            # the outcome is judged from the start: a warm-up does not set its level, and a run may fall during it
            counts = step >= (self.start if d.lagged else 0 if d.test == "outcome" else self.warmup)
            holding = (d.kind, judge.signal) in self.open
            judged = judge.push(value(judge.signal), counts, holding)
            if judged is None or (d.kind == "mismatch_growth" and not mismatch_level):
                continue
            flagged, critical, v, z = judged
            info = judge.signal == "entropy" and learning
            if not (flagged or critical):
                judge.streak = 0
                continue
            judge.streak += 1
            if judge.streak == 1:
                judge.streak_start, judge.streak_info = step, True
            judge.streak_info = judge.streak_info and info  # every row of the streak came while learning
            if holding or judge.streak >= self.cfg.confirm_steps:  # a change that lasts, not one noisy row
                info = info if holding else judge.streak_info
                flags.append((d, judge.signal, judge.streak_start, v, judge.base[0], z, critical and not info, info))
        a = value("accuracy")
        if self.evaluations is not None and math.isfinite(a):
            judged_eval = self.evaluations.push(step, a)
            ep = self.open.get(("accuracy_drop", "accuracy"))
            if judged_eval is None:
                if ep is not None:
                    ep.done = True  # an evaluation back above the line: the fall is over
            elif judged_eval[0]:  # confirmed: opens (at the first of the run) critical, or goes on
                acc = DETECTORS["accuracy_drop"]
                flags.append((acc, "accuracy", judged_eval[1], a, judged_eval[2], math.nan, True, False))
        changed: list[Episode] = []
        for flag in flags:
            ep = self._join(step, *flag)
            if ep is not None and all(ep is not seen for seen in changed):
                changed.append(ep)
        self._close()
        return changed

    def _join(
        self, step: int, d: Detector, signal: str, first: int, v: float, m: float, z: float, critical: bool, info: bool
    ) -> Episode | None:
        """Add a flagged row to its detector's open episode or open one (at `first`, the first of
        the flagged rows that confirmed it); the episode when it is new or changed."""
        key = (d.kind, signal)
        ep = self.open.get(key)
        if ep is not None:
            before = (ep.severity, ep.critical_step)
            ep.end_step, ep.end_row = step, self.row
            ep.info = ep.info and info
            if critical and ep.critical_step is None:
                ep.critical_step = step
                self._evidence(ep)
            if _extremity(z, v, m) > _extremity(ep.z, ep.value, ep.baseline):
                ep.value, ep.z = v, z
            return ep if (ep.severity, ep.critical_step) != before else None
        ep = Episode(d.kind, signal, first, step, v, m, z, step if critical else None, info, self.row, opened_step=step)
        if d.test != "ratio":
            self._evidence(ep)
        self.open[key] = ep
        if self.keep:
            self.episodes.append(ep)
        return ep

    def _evidence(self, ep: Episode) -> None:
        """The warnings that came before an outcome alert (ended at most evidence_steps rows ago)."""
        while self.warnings and self.warnings[0].end_row < self.row - self.evidence_rows:
            self.warnings.popleft()
        earlier = [w for w in self.warnings if w.severity == "warning" and w.step <= ep.step]
        earlier += [
            w
            for w in self.open.values()
            if w.severity == "warning" and w is not ep and w.step <= ep.step and all(w is not e for e in earlier)
        ]
        earlier.sort(key=lambda w: (w.step, w.kind))
        ep.evidence = tuple(dict.fromkeys(w.kind for w in earlier))
        ep.evidence_start_step = min([ep.step, *(w.step for w in earlier)])

    def _close(self) -> None:
        """Move the open episodes no flagged row can join any more (their condition stopped
        holding, or `gap` rows passed without one) to `final`."""
        done = [
            ep
            for ep in self.open.values()
            if ep.done or (DETECTORS[ep.detector].test != "evaluations" and self.row >= ep.end_row + self.gap)
        ]
        for ep in done:
            del self.open[(ep.detector, ep.signal)]
            if ep.severity == "warning":
                self.warnings.append(ep)
        self.final += done

    def closed(self) -> list[Episode]:
        """The episodes that became final (no flagged row can join them any more) since the last call."""
        done, self.final = self.final, []
        return done

    def finish(self) -> list[Episode]:
        """The run ended: every open episode is final."""
        done, self.open, self.final = [*self.final, *self.open.values()], {}, []
        return done


__all__ = ["CollapseSteps", "Episode", "planned_window", "warmup_steps"]
