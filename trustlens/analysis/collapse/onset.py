"""The collapse itself, against which the alerts of `trustlens.analysis.collapse` are measured.

A run collapses at the first evaluation whose held-out accuracy (the `eval/accuracy` metric,
mean over ranks) is below half the first evaluation's, or at the first step whose trailing mean
reward over `collapse_window(steps)` steps is below half the mean of the first such window,
whichever comes first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import polars as pl

from trustlens.analysis.buckets import collect
from trustlens.core.argument_checks import check_int, check_step_values

# the metric holding held-out accuracy (a fraction of problems solved, greedy decoding)
ACCURACY = "eval/accuracy"


def evaluations(metrics: pl.LazyFrame) -> pl.LazyFrame:
    """(step, accuracy) of each held-out evaluation in a run's metrics table: the `ACCURACY`
    metric, mean over ranks, in step order."""
    return (
        metrics.filter(pl.col("name") == ACCURACY)
        .group_by("step")
        .agg(pl.col("value").mean().alias("accuracy"))
        .sort("step")
    )


def collapse_window(steps: int) -> int:
    """Steps of the reward window of the collapse test and of the early baseline: 10% of the
    run's steps, at least 5."""
    return max(5, round(0.1 * steps))


def collapse_onset(
    accuracy: Sequence[tuple[int, float]], reward: Sequence[tuple[int, float]], window: int | None = None
) -> tuple[int | None, str | None]:
    """(step, cause) of the collapse, cause "accuracy" or "reward"; (None, None) without one.

    `accuracy`: (step, held-out accuracy) of each evaluation; `reward`: (step, mean reward) of
    each step. Accuracy collapse: the first evaluation below half the first one's. Reward
    collapse: the first step whose trailing mean over `window` steps (default
    collapse_window(len(reward))) is below half the mean of the first `window` steps. The
    earlier of the two.
    """
    accuracy, reward = check_step_values("accuracy", accuracy), check_step_values("reward", reward)
    found: list[tuple[int, str]] = []
    acc = sorted(accuracy)
    if acc and acc[0][1] > 0:
        found += [(s, "accuracy") for s, a in acc[1:] if a < 0.5 * acc[0][1]][:1]
    rew = sorted(reward)
    w = collapse_window(len(rew)) if window is None else check_int("window", window, low=1)
    values = [r for _, r in rew]
    first = math.fsum(values[:w]) / w if len(values) > w else 0.0
    if first > 0:
        for i in range(w, len(values)):
            if math.fsum(values[i - w + 1 : i + 1]) / w < 0.5 * first:
                found.append((rew[i][0], "reward"))
                break
    return min(found) if found else (None, None)


def accuracy_per_step(run) -> list[tuple[int, float]]:
    """(step, held-out accuracy) of each evaluation, mean over ranks; an evaluation without a
    finite accuracy is left out."""
    df = collect(evaluations(run.metrics).filter(pl.col("accuracy").is_finite()))
    return list(zip(df["step"].to_list(), df["accuracy"].to_list(), strict=True))


def reward_per_step(run) -> list[tuple[int, float]]:
    """(step, mean reward of the step's samples); a step without a finite mean (its rewards all
    unknown, or one NaN) is left out."""
    rewards = run.samples.group_by("step").agg(pl.col("reward").cast(pl.Float64).mean()).sort("step")
    df = collect(rewards.filter(pl.col("reward").is_finite()))
    return list(zip(df["step"].to_list(), df["reward"].to_list(), strict=True))


__all__ = ["ACCURACY", "accuracy_per_step", "collapse_onset", "collapse_window", "evaluations", "reward_per_step"]
