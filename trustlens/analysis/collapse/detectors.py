"""The collapse detectors of `trustlens.analysis.collapse`, fed one step at a time.

`CollapseSteps` takes the rows of `step_signals` one by one, in step order (`push`), and keeps
the alerts (`Episode`) they make. Both `detect_collapse` (every row of a finished run) and the
live monitor (`trustlens.live`, each step as it completes) run it, so that an alert raised live
is the alert found on the finished run. Its state is bounded by the windows of the configuration
(the baseline's steps, `smooth`, the reward window, `accuracy_evals`) and by the open episodes,
never by the run's length: each detector keeps its baseline values until the baseline is taken,
then only (m, s) and its trailing windows.

An episode is open while a flagged step may still join it (at most `merge_gap` rows after its
last flagged step) and final after that, or when the run ends (`finish`). While open it can
still change: its critical step, its severity ("info" → warning while an entropy episode's steps
stop coming with learning; → critical), its end step and its most extreme value.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from trustlens.analysis.collapse.config import ALERT_WINDOW_MAX, REWARD_WINDOW_MAX, CollapseConfig, alert_window
from trustlens.analysis.collapse.levels import Learning, MismatchLevel, Trailing
from trustlens.run import blocked_column


def planned_window(manifest: dict | None) -> int:
    """Steps of the alerts' early baseline and merge gap for a run with this run.json: the
    alert_window of its planned steps (`planned_steps`, or the built-in trainer's `config.steps`),
    ALERT_WINDOW_MAX when it names none. Known before the run ends, so that a live run and the
    finished run judge every step alike."""
    manifest = manifest or {}
    planned = manifest.get("planned_steps") or (manifest.get("config") or {}).get("steps")
    if isinstance(planned, int) and not isinstance(planned, bool) and planned > 0:
        return alert_window(planned)
    return ALERT_WINDOW_MAX


@dataclass(frozen=True)
class _Detector:
    """A signal judged against its baseline: `up` (rises) or not (falls) by the ratios
    `warn` and `crit` of x̄ to m (`crit` None: never critical; `crit_window`: the critical test
    is on the mean over the reward window instead), with |x̄ − m| > `min_abs`."""

    kind: str
    signal: str
    up: bool
    warn: float
    crit: float | None
    smooth: bool = True
    min_abs: float = 0.0
    crit_window: bool = False
    lagged: bool = False  # the signal compares π with μ: its baseline starts at baseline_start


def _detectors(columns: list[str], cfg: CollapseConfig, rule: str | None) -> list[_Detector]:
    f = cfg.blocked_factor
    out = [
        _Detector("entropy_collapse", "entropy", False, 1 - cfg.entropy_drop, 1 - 2 * cfg.entropy_drop),
        _Detector("entropy_surge", "entropy", True, 1 + cfg.entropy_surge, 1 + 2 * cfg.entropy_surge),
        _Detector("mismatch_growth", "k3_kl", True, cfg.mismatch_growth, None, lagged=True),
        _Detector("grad_norm_spike", "grad_norm", True, cfg.grad_spike, 2 * cfg.grad_spike, smooth=False),
        _Detector("reward_drop", "reward", False, 1 - cfg.reward_drop, 1 - cfg.reward_critical, crit_window=True),
    ]
    watched = [blocked_column(rule)] if rule is not None else [c for c in columns if c.startswith("blocked_")]
    for col in watched:
        if col in columns:
            out += [
                _Detector("blocked_drift", col, True, f, f * f, min_abs=cfg.blocked_drift, lagged=True),
                _Detector("blocked_drift", col, False, 1 / f, 1 / (f * f), min_abs=cfg.blocked_drift, lagged=True),
            ]
    return [d for d in out if d.signal in columns]


def _passes(d: _Detector, v: float, m: float, ratio: float) -> bool:
    if abs(v - m) <= d.min_abs:
        return False
    return v > ratio * m if d.up else v < ratio * m


@dataclass
class _Flag:
    """One flagged step of one detector."""

    kind: str
    signal: str
    step: int
    value: float
    baseline: float
    z: float
    critical: bool
    info: bool = False  # an entropy step while the run learns (alert_levels): neither warning nor critical


@dataclass
class Episode:
    """One alert: flagged steps of one detector at most `merge_gap` rows apart (the columns of
    ALERT_SCHEMA but the drivers and the message)."""

    kind: str
    signal: str
    step: int  # first flagged step
    end_step: int  # last flagged step so far
    value: float  # x̄ at the most extreme step (a critical reward_drop step: r̄)
    baseline: float  # the baseline median m
    z: float  # robust z at the most extreme step (NaN for accuracy_drop)
    critical_step: int | None  # first critical step
    info: bool  # every step so far came while the run learned (an entropy alert)
    end_row: int = field(repr=False)  # row (in step order) of end_step

    @property
    def severity(self) -> str:
        return "critical" if self.critical_step is not None else "info" if self.info else "warning"


def _extremity(z: float, value: float, baseline: float) -> float:
    """How far a flagged step is from its baseline: |z|, or |value − baseline| where z is NaN."""
    return abs(z) if math.isfinite(z) else abs(value - baseline)


class _Judge:
    """One detector's state: its baseline values (until taken), then (m, s), and its windows."""

    def __init__(self, d: _Detector, cfg: CollapseConfig, n_base: int, n_reward: int) -> None:
        self.d, self.n_base = d, n_base
        self.rel_floor = cfg.rel_floor
        self.history: list[float] = []  # the baseline's values, until it is taken
        self.base: tuple[float, float] | None = None
        self.dead = False  # too few finite baseline values, or nothing to fall from
        self.rows = 0  # rows seen since the detector's first row
        self.smoothed = Trailing(cfg.smooth if d.smooth else 1)
        self.window = Trailing(n_reward)

    def _take_baseline(self) -> None:
        """(median, robust scale) of the finite values among the baseline's rows."""
        hist = np.asarray(self.history, dtype=np.float64)
        hist = hist[np.isfinite(hist)]
        self.history = []
        if len(hist) < min(self.n_base, 3):
            self.dead = True
            return
        m = float(np.median(hist))
        s = 1.4826 * float(np.median(np.abs(hist - m)))
        self.base = m, max(s, self.rel_floor * abs(m), 1e-12)
        self.dead = not self.d.up and m <= 0  # nothing to fall from

    def push(self, x: float, counts: bool, cfg: CollapseConfig) -> tuple[bool, bool, float, float] | None:
        """(warning test, critical test, value, z) of this row, or None when it is not judged;
        `counts`: the row is at or after the detector's first step (the baseline's or the
        judged ones; the trailing windows take every row)."""
        self.smoothed.push(x)
        self.window.push(x)
        if not counts:
            return None
        self.rows += 1
        if self.rows <= self.n_base:
            self.history.append(x)
            if self.rows == self.n_base:
                self._take_baseline()
            return None
        if self.dead or self.base is None or not math.isfinite(x):
            return None
        d, (m, s) = self.d, self.base
        v = self.smoothed.stat(np.median)
        z = (v - m) / s
        warn = abs(z) > cfg.z_warning and _passes(d, v, m, d.warn)
        if d.crit is None:
            crit = False
        elif d.crit_window:
            mean = self.window.stat(np.mean)
            crit = _passes(d, mean, m, d.crit)
            if crit:
                v, z = mean, (mean - m) / s
        else:
            crit = warn and _passes(d, v, m, d.crit)
        return warn, crit, v, z


class CollapseSteps:
    """The collapse detectors over rows of step_signals pushed one by one in step order (module
    docstring). `columns`: the signal columns the rows have; `rule`: the watched active rule
    (None: every blocked_<rule> column); `start`: the first step of the π-vs-μ baselines; `kind`:
    the run's model kind; `window`: the baseline's steps and merge gap where the config leaves
    them None (`planned_window`); `keep`: keep every episode in `episodes` (a finished run's
    list; a live monitor keeps only the open ones)."""

    def __init__(
        self,
        cfg: CollapseConfig,
        columns: list[str],
        rule: str | None,
        start: int,
        kind: str,
        window: int,
        *,
        keep: bool = True,
    ) -> None:
        self.cfg = cfg
        n_base = cfg.baseline_steps if cfg.baseline_steps is not None else window
        n_reward = cfg.reward_window if cfg.reward_window is not None else min(REWARD_WINDOW_MAX, n_base)
        self.gap = cfg.merge_gap if cfg.merge_gap is not None else window
        self.start = start
        self.judges = [_Judge(d, cfg, n_base, n_reward) for d in _detectors(columns, cfg, rule)]
        self.mismatch = MismatchLevel(kind, cfg.smooth, cfg.mismatch_k3_level)
        self.learning = Learning(n_base, n_reward)
        self.accuracy = "accuracy" in columns
        self.first_accuracy: float | None = None  # a₀
        self.below: deque[bool] = deque(maxlen=cfg.accuracy_evals)  # the last evaluations below the line
        self.evals = 0
        self.row = -1
        self.keep = keep
        self.episodes: list[Episode] = []  # with keep: every episode so far, in the order they opened
        self.open: dict[tuple[str, str], Episode] = {}

    def push(self, step: int, row: dict[str, float | None]) -> list[Episode]:
        """Judge the row of `step` (signal → value, None or NaN where absent); the episodes it
        opened or changed."""
        self.row += 1

        def value(name: str) -> float:
            v = row.get(name)
            return math.nan if v is None else float(v)

        mismatch_level = self.mismatch.push(value("k3_kl"), value("prob_diff_mean"))
        learning = self.learning.push(value("accuracy"), value("reward"))
        flags = []
        for judge in self.judges:
            counts = not judge.d.lagged or step >= self.start  # before the engine's lag: not even the baseline's
            judged = judge.push(value(judge.d.signal), counts, self.cfg)
            if judged is None or (judge.d.kind == "mismatch_growth" and not mismatch_level):
                continue
            warn, crit, v, z = judged
            info = judge.d.signal == "entropy" and learning
            if warn or crit:
                flags.append(_Flag(judge.d.kind, judge.d.signal, step, v, judge.base[0], z, crit and not info, info))  # type: ignore[index]
        if self.accuracy:
            flags += self._accuracy_flag(step, value("accuracy"))
        changed: list[Episode] = []
        for f in flags:
            ep = self._join(f)
            if ep is not None and all(ep is not seen for seen in changed):
                changed.append(ep)
        return changed

    def _accuracy_flag(self, step: int, a: float) -> list[_Flag]:
        """accuracy_drop: an evaluation a after the first, a₀, flagged when a < (1 −
        accuracy_drop)·a₀, critical when the last `accuracy_evals` evaluations all are. It has no
        z (NaN): an evaluation's noise depends on its size, which the run's metrics do not hold."""
        if not math.isfinite(a):
            return []
        self.evals += 1
        if self.first_accuracy is None:
            self.first_accuracy = a
            self.below.append(False)
            return []
        a0 = self.first_accuracy
        below = a < (1 - self.cfg.accuracy_drop) * a0
        self.below.append(below)
        if a0 <= 0 or not below:
            return []
        k = self.cfg.accuracy_evals
        critical = self.evals - 1 >= k and len(self.below) == k and all(self.below)
        return [_Flag("accuracy_drop", "accuracy", step, a, a0, math.nan, critical)]

    def _join(self, f: _Flag) -> Episode | None:
        """Add a flagged step to its open episode (a flagged step of the same detector at most
        `gap` rows before) or open one; the episode when it is new or changed."""
        key = (f.kind, f.signal)
        ep = self.open.get(key)
        if ep is not None and self.row <= ep.end_row + self.gap:
            before = (ep.severity, ep.critical_step)
            ep.end_step, ep.end_row = f.step, self.row
            ep.info = ep.info and f.info
            if f.critical and ep.critical_step is None:
                ep.critical_step = f.step
            if _extremity(f.z, f.value, f.baseline) > _extremity(ep.z, ep.value, ep.baseline):
                ep.value, ep.z = f.value, f.z
            return ep if (ep.severity, ep.critical_step) != before else None
        ep = Episode(
            f.kind, f.signal, f.step, f.step, f.value, f.baseline, f.z, f.step if f.critical else None, f.info, self.row
        )
        self.open[key] = ep
        if self.keep:
            self.episodes.append(ep)
        return ep

    def closed(self) -> list[Episode]:
        """The open episodes no flagged step can join any more (more than `gap` rows after
        their last), now final; they leave the open set."""
        done = [ep for ep in self.open.values() if self.row > ep.end_row + self.gap]
        for ep in done:
            del self.open[(ep.kind, ep.signal)]
        return done

    def finish(self) -> list[Episode]:
        """The run ended: every open episode is final."""
        done, self.open = list(self.open.values()), {}
        return done


__all__ = ["CollapseSteps", "Episode", "planned_window"]
