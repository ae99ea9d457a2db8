"""The level an alert needs besides its change against the run's own baseline
(`trustlens.analysis.collapse`): a change that stays inside the normal range, or that comes
with learning, is not worth a warning.

Mismatch. A training–inference mismatch that grows from 7e-5 to 1.6e-4 has doubled, yet it is
far inside what a healthy run shows. A mismatch_growth step is flagged only when the mismatch
is above the published normal range (verl's FAQ on training–inference mismatch): the smoothed
k3 estimate of KL(μ‖π_old) (nats per token) at least `MISMATCH_K3_NORMAL[kind]`, or the
smoothed mean |μ − π_old| of the sampled tokens (a probability) at least
`PROB_DIFF_MEAN_NORMAL`. The model kind comes from the run's manifest (`model_kind`, "dense"
when absent); a kind without a published k3 range is judged on prob_diff_mean alone.

Entropy. Entropy falls as a policy sharpens on what it learned; a fall is a sign of collapse only
when the run stops learning. An entropy step is "learning" when held-out accuracy or reward is
rising: the latest evaluation at or before it is above the first one, or the mean reward over
the trailing reward window is above the reward baseline (the median of its baseline steps). An
entropy alert whose every step was learning is an "info" alert, neither warning nor critical.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl

# upper end of the normal k3 mismatch (nats per token) per model kind
MISMATCH_K3_NORMAL = {"dense": 1e-3}
# upper end of the normal mean |μ − π_old| over sampled tokens (any model kind)
PROB_DIFF_MEAN_NORMAL = 0.005
# the model kind of a run whose manifest does not name one
DEFAULT_MODEL_KIND = "dense"


def model_kind(run) -> str:
    """The run's model kind from its manifest's `model_kind` ("dense", "moe", ...), lower case;
    DEFAULT_MODEL_KIND when absent or not a string."""
    kind = (getattr(run, "manifest", None) or {}).get("model_kind")
    return kind.strip().lower() if isinstance(kind, str) and kind.strip() else DEFAULT_MODEL_KIND


class Trailing:
    """The last `k` values pushed (a bounded window), and statistics of its finite ones."""

    def __init__(self, k: int) -> None:
        self.values: deque[float] = deque(maxlen=k)

    def push(self, value: float) -> None:
        self.values.append(value)

    def stat(self, stat: Callable[[np.ndarray], Any]) -> float:
        """`stat` (np.median, np.mean) of the finite values in the window; NaN where none is."""
        recent = np.asarray(self.values, dtype=np.float64)
        recent = recent[np.isfinite(recent)]
        return float(stat(recent)) if len(recent) else math.nan


def trailing_median(x: np.ndarray, k: int) -> np.ndarray:
    """Per row i, the median of the finite values among rows i−k+1..i (NaN where none is)."""
    window = Trailing(k)
    out = np.full(len(x), np.nan)
    for i, value in enumerate(x):
        window.push(float(value))
        out[i] = window.stat(np.median)
    return out


def _column(signals: pl.DataFrame, name: str) -> np.ndarray:
    if name not in signals.columns:
        return np.full(signals.height, np.nan)
    return signals[name].cast(pl.Float64).fill_null(np.nan).to_numpy()


class MismatchLevel:
    """Row by row (`push`, in step order), whether the mismatch is above the normal range: the
    trailing median over `smooth` rows of k3_kl ≥ the k3 level (`k3_level`, default
    MISMATCH_K3_NORMAL of the model `kind`; none for a kind without one), or that of
    prob_diff_mean ≥ PROB_DIFF_MEAN_NORMAL. State: the last `smooth` values of each."""

    def __init__(self, kind: str, smooth: int, k3_level: float | None = None) -> None:
        self.level = MISMATCH_K3_NORMAL.get(kind) if k3_level is None else k3_level
        self.k3, self.prob_diff = Trailing(smooth), Trailing(smooth)

    def push(self, k3_kl: float, prob_diff_mean: float) -> bool:
        self.k3.push(k3_kl)
        self.prob_diff.push(prob_diff_mean)
        above = self.prob_diff.stat(np.median) >= PROB_DIFF_MEAN_NORMAL
        return bool(above or (self.level is not None and self.k3.stat(np.median) >= self.level))


def mismatch_above_normal(signals: pl.DataFrame, kind: str, smooth: int, k3_level: float | None = None) -> np.ndarray:
    """Per row of `signals` (step_signals), whether the mismatch is above the normal range
    (`MismatchLevel`)."""
    level = MismatchLevel(kind, smooth, k3_level)
    k3, prob_diff = _column(signals, "k3_kl"), _column(signals, "prob_diff_mean")
    return np.array([level.push(float(a), float(b)) for a, b in zip(k3, prob_diff, strict=True)], dtype=bool)


class Learning:
    """Row by row (`push`, in step order), whether held-out accuracy or reward is rising there:
    the latest evaluation at or before the row above the first evaluation, or the mean reward over
    the `reward_window` rows ending at it above the median reward of the first `baseline_steps`
    rows (from row `baseline_steps` on). State: the first and latest evaluation, the baseline's
    rewards, the last `reward_window` rewards."""

    def __init__(self, baseline_steps: int, reward_window: int) -> None:
        self.baseline_steps = baseline_steps
        self.rows = 0
        self.first_accuracy, self.latest_accuracy = math.nan, math.nan
        self.base: list[float] = []  # finite rewards of the baseline rows
        self.reward = Trailing(reward_window)

    def push(self, accuracy: float, reward: float) -> bool:
        if math.isfinite(accuracy):
            self.latest_accuracy = accuracy
            if not math.isfinite(self.first_accuracy):
                self.first_accuracy = accuracy
        rising = self.latest_accuracy > self.first_accuracy
        self.reward.push(reward)
        if self.rows < self.baseline_steps:
            if math.isfinite(reward):
                self.base.append(reward)
        elif self.base:
            mean = self.reward.stat(np.mean)
            rising |= math.isfinite(mean) and mean > float(np.median(self.base))
        self.rows += 1
        return bool(rising)


def learning_steps(signals: pl.DataFrame, baseline_steps: int, reward_window: int) -> np.ndarray:
    """Per row of `signals`, whether held-out accuracy or reward is rising there (`Learning`)."""
    learning = Learning(baseline_steps, reward_window)
    accuracy, reward = _column(signals, "accuracy"), _column(signals, "reward")
    return np.array([learning.push(float(a), float(r)) for a, r in zip(accuracy, reward, strict=True)], dtype=bool)


__all__ = [
    "DEFAULT_MODEL_KIND",
    "MISMATCH_K3_NORMAL",
    "PROB_DIFF_MEAN_NORMAL",
    "Learning",
    "MismatchLevel",
    "Trailing",
    "learning_steps",
    "mismatch_above_normal",
    "model_kind",
]
