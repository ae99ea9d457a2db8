"""Held-out accuracy's fall (`AccuracyFall`), the state of the accuracy_drop detector: each
evaluation a against the baseline m, the highest level of the latest `accuracy_memory`
evaluations, a level being the median of the latest `accuracy_reference` evaluations that were
not below the line. A fall within those evaluations is judged from the level before it, even
after the median has followed it down (a run that falls at its first evaluations and sits low);
a drift slower than the line over `accuracy_memory` evaluations is followed.

With the evaluation's size n (problems, `eval_size`: run.json's or CollapseConfig's) the noise
is binomial: a − m has the standard error se = √(m(1 − m)/n · (1 + π/(2k))), the evaluation's and
that of the median of the k evaluations m is the median of (π/2k of a variance; the median of k
evaluations is about as noisy as a mean of 2k/π). An evaluation is below the line when
m − a > z_accuracy · se and m − a > accuracy_min_drop · m (the policy moves between evaluations
too: a fall of 3 standard errors of a few percent is its own noise). Without n it is below when
a < (1 − accuracy_drop) · m.

Where the fall began: the lower CUSUM of Page (1954, *Continuous Inspection Schemes*),
g = max(0, g + (m − a)/se − k) with the allowance k = cusum_slack, accumulates the evaluations'
fall; the change point it estimates is the first evaluation since g was last 0 (Hinkley 1971,
*Inference about the change-point from cumulative sum tests*, Biometrika 58). A fall confirmed
by `accuracy_evals` evaluations below the line in a row, or by one below the line while g > h
= cusum_alarm (Page's alarm: the evaluations before it fell too, each by less than the line),
began there (or at the first below the
line, if earlier), so its alert's evidence, and the checkpoint a stop keeps, reach back to the
evaluation where the accuracy started falling. After a confirmed fall ends (an evaluation back
above the line) the CUSUM restarts.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from trustlens.analysis.collapse.config import CollapseConfig
from trustlens.analysis.collapse.detectors import DETECTORS, past


def eval_size(manifest: dict | None) -> int | None:
    """Problems per held-out evaluation as run.json names them (`eval_size`, or the built-in
    trainer's `config.eval_size`); None when it names none."""
    manifest = manifest or {}
    n = manifest.get("eval_size", (manifest.get("config") or {}).get("eval_size"))
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


class AccuracyFall:
    """accuracy_drop's state, fed one evaluation at a time (`push`): the latest unflagged
    evaluations, their medians at the latest `accuracy_memory` evaluations (the highest is the
    baseline), the run of flagged ones, and the lower CUSUM of the evaluations' fall (with
    `eval_size`)."""

    def __init__(self, cfg: CollapseConfig, eval_size: int | None) -> None:
        self.cfg, self.d, self.n = cfg, DETECTORS["accuracy_drop"], eval_size
        self.floor = self.d.min_abs(cfg)
        self.reference: deque[float] = deque(maxlen=cfg.accuracy_reference)
        # (median of `reference`, its evaluations) at each of the latest `accuracy_memory` evaluations;
        # of equal medians the one of more evaluations is the baseline (the less noisy)
        self.levels: deque[tuple[float, int]] = deque(maxlen=cfg.accuracy_memory)
        self.below = 0  # evaluations in a row below the line
        self.first = -1  # the step of the first of them
        self.cusum = 0.0  # lower CUSUM of the standardised fall: max(0, g + (m − a)/se − k)
        self.since = -1  # the first evaluation since the CUSUM was last 0 (-1: it is 0)
        self.confirmed = False  # the evaluations below the line since the last one above are a fall

    def _below(self, step: int, a: float, m: float, k: int) -> bool:
        """Whether evaluation `a` is below the line of baseline `m`, the median of `k`
        evaluations (module docstring); with `eval_size` it also moves the CUSUM."""
        if self.n is None:
            return m >= self.floor and past(self.d, a, m, self.d.factor(self.cfg), self.floor)
        # the binomial standard error of a − m: the evaluation's and its baseline median's (π/2k of it)
        se = math.sqrt(max(m * (1 - m), 1e-12) / self.n * (1 + math.pi / (2 * k)))
        self.cusum = max(0.0, self.cusum + (m - a) / se - self.cfg.cusum_slack)
        self.since = -1 if self.cusum == 0 else step if self.since < 0 else self.since
        fall = m - a
        return m >= self.floor and fall > self.cfg.z_accuracy * se and fall > self.cfg.accuracy_min_drop * m

    @property
    def began(self) -> int | None:
        """Where a fall under way began (the step `push` would name), None when none is: the
        earliest step an accuracy alert not raised yet may begin at."""
        starts = [s for s in (self.first if self.below else -1, self.since) if s >= 0]
        return min(starts) if starts else None

    def push(self, step: int, a: float) -> tuple[bool, int, float] | None:
        """(confirmed: `accuracy_evals` evaluations in a row below the line or one with the CUSUM
        past `cusum_alarm`, where the fall began,
        the baseline) of an evaluation; None before the first or while not below. The fall began
        at the first of the evaluations below the line, or with `eval_size` at the first
        evaluation of the CUSUM's excursion (Page's change-point estimate) if earlier."""
        if not self.reference:
            self.reference.append(a)
            return None
        self.levels.append((float(np.median(np.asarray(self.reference))), len(self.reference)))
        m, k = max(self.levels)
        # a flagged evaluation never joins the reference: the levels hold still during the fall
        if not self._below(step, a, m, k):
            self.reference.append(a)
            if self.confirmed:  # a confirmed fall ended: the CUSUM restarts
                self.cusum, self.since, self.confirmed = 0.0, -1, False
            self.below = 0
            return None
        self.below += 1
        if self.below == 1:
            self.first = step
        assert self.began is not None
        self.confirmed = self.confirmed or self.below >= self.cfg.accuracy_evals or self.cusum > self.cfg.cusum_alarm
        return self.confirmed, self.began, m


__all__ = ["AccuracyFall", "eval_size"]
