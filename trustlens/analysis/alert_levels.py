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


def trailing_median(x: np.ndarray, k: int) -> np.ndarray:
    """Per row i, the median of the finite values among rows i−k+1..i (NaN where none is)."""
    out = np.full(len(x), np.nan)
    for i in range(len(x)):
        recent = x[max(0, i - k + 1) : i + 1]
        recent = recent[np.isfinite(recent)]
        if len(recent):
            out[i] = float(np.median(recent))
    return out


def _column(signals: pl.DataFrame, name: str) -> np.ndarray:
    if name not in signals.columns:
        return np.full(signals.height, np.nan)
    return signals[name].cast(pl.Float64).fill_null(np.nan).to_numpy()


def mismatch_above_normal(signals: pl.DataFrame, kind: str, smooth: int, k3_level: float | None = None) -> np.ndarray:
    """Per row of `signals` (step_signals), whether the mismatch is above the normal range: the
    trailing median over `smooth` steps of k3_kl ≥ the k3 level (`k3_level`, default
    MISMATCH_K3_NORMAL of the model `kind`; none for a kind without one), or that of
    prob_diff_mean ≥ PROB_DIFF_MEAN_NORMAL."""
    level = MISMATCH_K3_NORMAL.get(kind) if k3_level is None else k3_level
    above = trailing_median(_column(signals, "prob_diff_mean"), smooth) >= PROB_DIFF_MEAN_NORMAL
    if level is not None:
        above |= trailing_median(_column(signals, "k3_kl"), smooth) >= level
    return above


def learning_steps(signals: pl.DataFrame, baseline_steps: int, reward_window: int) -> np.ndarray:
    """Per row of `signals`, whether held-out accuracy or reward is rising there: the latest
    evaluation at or before the row above the first evaluation, or the mean reward over the
    `reward_window` rows ending at it above the median reward of the first `baseline_steps`
    rows."""
    acc = _column(signals, "accuracy")
    rising = np.zeros(signals.height, dtype=bool)
    evaluated = np.flatnonzero(np.isfinite(acc))
    if len(evaluated):
        first, latest = acc[evaluated[0]], np.nan
        for i in range(evaluated[0], signals.height):
            latest = acc[i] if np.isfinite(acc[i]) else latest
            rising[i] = latest > first
    reward = _column(signals, "reward")
    base = reward[:baseline_steps]
    base = base[np.isfinite(base)]
    if len(base):
        m = float(np.median(base))
        for i in range(baseline_steps, signals.height):
            recent = reward[max(0, i - reward_window + 1) : i + 1]
            recent = recent[np.isfinite(recent)]
            rising[i] |= bool(len(recent)) and float(np.mean(recent)) > m
    return rising


__all__ = [
    "DEFAULT_MODEL_KIND",
    "MISMATCH_K3_NORMAL",
    "PROB_DIFF_MEAN_NORMAL",
    "learning_steps",
    "mismatch_above_normal",
    "model_kind",
]
