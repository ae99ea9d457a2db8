"""Outcomes of runs and their mean ± standard error over seeds (the `trustlens compare` table).

Per run (`run_outcome`), with steps numbered as recorded:

    acc_start, acc_final, acc_best   held-out accuracy (`eval/accuracy`) at the first and the last
                                     evaluation, and the highest one
    acc_lowest                       the lowest evaluation (how far a run that did not collapse dipped)
    acc_drop                         the best accuracy level minus the final one, a level being the
                                     mean of `eval_window` consecutive evaluations (the final level:
                                     the last ones); 0 when the final level is the best;
                                     null with 3 evaluations or fewer (one level: no drop to
                                     measure, whatever acc_final − acc_start)
    acc_drop_noise                   the 95th percentile of acc_drop among runs whose accuracy
                                     never changes: as many evaluations, the same w, each a
                                     binomial proportion over the run's `eval_size` problems at p̄,
                                     the mean of the run's evaluations (NOISE_DRAWS simulated
                                     runs, a fixed seed); null when the run records no eval_size.
                                     The best level is the highest of many, so even a constant run
                                     ends below it: 2 standard errors of the difference of two
                                     levels (0.036 at 26 evaluations, w = 3, 500 problems, p̄ =
                                     0.42) would put 17% of constant runs outside noise; this band
                                     (0.046 there) puts 5%
    within_noise                     acc_drop ≤ acc_drop_noise: the run ends within noise of its
                                     best (null without acc_drop_noise)
    collapse_step                    the step the run collapsed at (`collapse_onset`), null if never
    collapse_cause                   "accuracy" or "reward", null if never
    line_margin                      how far the lowest evaluation a after the first lies from
                                     the collapse line a₀/2 (whether a run collapsed on accuracy
                                     depends on it alone), |a − a₀/2| / SE in standard errors of
                                     that difference, both evaluations binomial over eval_size
                                     problems: SE² = (ℓ(1 − ℓ) + a₀(1 − a₀)/4)/eval_size, ℓ =
                                     a₀/2; null for a reward collapse or without eval_size. Below
                                     LINE_MARGIN another draw of held-out problems could well turn
                                     the outcome (beyond it, less often)
    block_rate                       share of the A ≠ 0 tokens the run's active rule blocked (all
                                     steps and updates); of a run that holds only metrics
                                     (imported), the mean over steps of its logged rate
                                     (trustlens.analysis.collapse.logged), and block_rate_low_mu
                                     null
    block_rate_low_mu                the same among A ≠ 0 tokens with μ < 0.1 (LOW_MU)
    k3_start, k3_end                 k3_kl (nats), mean over the first and the last `window` of
                                     the steps with token rows
    tv_start, tv_end                 prob_diff_mean = mean |π_old − μ| (the binary TV), likewise
    first_critical                   the first step at which a collapse alert was critical
                                     (`detect_collapse`, its critical_step)
    first_critical_kind              that alert's kind (e.g. accuracy_drop, reward_drop)
    lead                             collapse_step − first_critical: how many steps the first
                                     critical alert came before the collapse (null without both)

Collapse (`trustlens.analysis.collapse.onset.collapse_onset`): the first evaluation whose accuracy is
below half the first evaluation's, or the first step whose trailing mean reward over `window`
steps is below half the mean reward of the first `window` steps, whichever comes first; `window`
= max(5, round(0.1 · steps)) steps (`collapse_window`), steps counted in the samples table for
the reward and in the token rows for k3 and TV.

Over seeds (`seed_table`, as text: `trustlens.analysis.seed_text`), one row per rule: n (runs),
collapsed (runs that collapsed), within_noise (runs that ended within noise of their best), and for
every outcome above `<name>_mean` and `<name>_se`, the standard error s/√n with s the sample
standard deviation (ddof = 1; null for a single run). steps_to_collapse is averaged over the
runs that collapsed only. Runs measured together should share their settings apart from rule and
seed (`settings_key`); a rule and seed twice is refused (`check_distinct_seeds`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

import numpy as np
import polars as pl

from trustlens.analysis.buckets import anchor_column, collect, nonzero_advantage, weighted, weighted_mean
from trustlens.analysis.clipping import blocked_per_step
from trustlens.analysis.collapse import detect_collapse
from trustlens.analysis.collapse.logged import CLIP_RULE, logged_signals, metrics_only
from trustlens.analysis.collapse.onset import (
    accuracy_per_step,
    collapse_onset,
    collapse_window,
    reward_per_step,
)
from trustlens.analysis.mismatch import mismatch_per_step
from trustlens.analysis.sources import require_run
from trustlens.analysis.summary import exact_aggregates
from trustlens.core.argument_checks import check_columns, check_sequence, check_str, check_type
from trustlens.core.render import csv_safe  # the seed tables' CSV guard, re-exported
from trustlens.run import blocked_column

LOW_MU = 0.1  # μ below this is a "low-μ" token in block_rate_low_mu

# The per-run outcomes averaged over seeds, in table order.
OUTCOMES: tuple[str, ...] = (
    "acc_start",
    "acc_final",
    "acc_best",
    "acc_lowest",
    "acc_drop",
    "steps_to_collapse",
    "block_rate",
    "block_rate_low_mu",
    "k3_start",
    "k3_end",
    "tv_start",
    "tv_end",
)


def mean_se(values: Iterable[float | None]) -> tuple[float | None, float | None, int]:
    """(mean, standard error, n) of the non-null values: se = s/√n with s the sample standard
    deviation (ddof = 1); mean None when n = 0, se None when n < 2."""
    xs = [float(v) for v in values if v is not None and not math.isnan(v)]
    n = len(xs)
    if n == 0:
        return None, None, 0
    mean = math.fsum(xs) / n
    if n < 2:
        return mean, None, n
    var = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)
    return mean, math.sqrt(var / n), n


def _block_rates(run, rule: str | None) -> tuple[float | None, float | None]:
    """(share of A ≠ 0 tokens `rule` blocks, the same among tokens with μ < LOW_MU): exact for a
    sampled run too (the first from its aggregates; every μ < 0.1 token is kept)."""
    tokens = run.tokens
    if rule is None or blocked_column(rule) not in tokens.collect_schema().names():
        return None, None
    per_step = blocked_per_step(tokens, [rule], aggregates=exact_aggregates(run))
    counted = int(per_step["count"].sum())
    low = pl.col(anchor_column(tokens)).cast(pl.Float64) < math.log(LOW_MU)
    rate_low = weighted_mean(pl.col(blocked_column(rule)), nonzero_advantage() & low, weights=weighted(tokens))
    return (int(per_step["blocked"].sum()) / counted if counted else None), collect(tokens.select(rate_low)).item()


def eval_window(evaluations: int) -> int:
    """w, the evaluations averaged into one accuracy level: 10% of the run's evaluations, at
    least 3 (all of them when there are fewer)."""
    return min(evaluations, max(3, round(0.1 * evaluations)))


# constant-accuracy runs simulated for acc_drop_noise, and the quantile of their acc_drop taken
NOISE_DRAWS = 20_000
NOISE_QUANTILE = 0.95


def level_drops(accuracy: np.ndarray, w: int) -> np.ndarray:
    """acc_drop of each row of `accuracy` (..., E) evaluations in step order: the highest mean of
    `w` consecutive evaluations minus the mean of the last `w`."""
    sums = np.cumsum(np.concatenate([np.zeros((*accuracy.shape[:-1], 1)), accuracy], axis=-1), axis=-1)
    levels = (sums[..., w:] - sums[..., :-w]) / w  # (..., E − w + 1)
    return levels.max(axis=-1) - levels[..., -1]


def drop_noise(evaluations: int, eval_size: int, p: float) -> float:
    """acc_drop_noise (module docstring): the NOISE_QUANTILE of acc_drop over NOISE_DRAWS runs of
    `evaluations` evaluations, each the share of `eval_size` problems solved with probability p."""
    rng = np.random.default_rng(0)
    draws = rng.binomial(eval_size, p, size=(NOISE_DRAWS, evaluations)) / eval_size  # (D, E)
    return float(np.quantile(level_drops(draws, eval_window(evaluations)), NOISE_QUANTILE))


def noise_tail(outside: int, n: int) -> float:
    """The chance that at least `outside` of n runs whose accuracy never changes end outside
    noise (acc_drop > acc_drop_noise, each with probability 1 − NOISE_QUANTILE): P(X ≥ outside),
    X ~ Binomial(n, 1 − NOISE_QUANTILE). Below 5%: more runs fell from their best than chance
    explains."""
    q = 1 - NOISE_QUANTILE
    return math.fsum(math.comb(n, j) * q**j * (1 - q) ** (n - j) for j in range(max(outside, 0), n + 1))


def accuracy_drop(accuracy: list[float], eval_size: int | None) -> tuple[float | None, float | None]:
    """(acc_drop, acc_drop_noise) of a run's evaluations in step order (module docstring); both
    null with 3 evaluations or fewer (a single level), the noise null without a positive eval_size."""
    if len(accuracy) <= eval_window(len(accuracy)):  # none, or one level: nothing to fall from
        return None, None
    drop = float(level_drops(np.asarray(accuracy, dtype=np.float64), eval_window(len(accuracy))))
    if not eval_size or eval_size <= 0:
        return drop, None
    return drop, drop_noise(len(accuracy), eval_size, math.fsum(accuracy) / len(accuracy))


# line_margin below this many standard errors: the outcome is within evaluation noise of the line
LINE_MARGIN = 2.0


def line_margin(accuracy: list[tuple[int, float]], cause: str | None, eval_size: int | None) -> float | None:
    """`line_margin` of a run (module docstring) from its (step, accuracy) evaluations in step
    order and the cause of its collapse (`collapse_onset`)."""
    if not eval_size or eval_size <= 0 or len(accuracy) < 2 or cause == "reward" or accuracy[0][1] <= 0:
        return None
    first = accuracy[0][1]
    line = first / 2
    se = math.sqrt((line * (1 - line) + first * (1 - first) / 4) / eval_size)
    return abs(min(a for _, a in accuracy[1:]) - line) / se


def _ends(values: list[float | None], w: int) -> tuple[float | None, float | None]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None, None
    k = min(w, len(finite))
    return math.fsum(finite[:k]) / k, math.fsum(finite[-k:]) / k


def rule_and_seed(run) -> tuple[str | None, int | None]:
    """The rule a run trained with (its active rule, else its config's) and its seed (config)."""
    config = run.manifest.get("config") or {}
    return run.active_rule or config.get("rule"), config.get("seed")


def settings(run) -> dict:
    """The run's settings (its manifest's config) without its rule and seed."""
    config = dict(run.manifest.get("config") or {})
    config.pop("seed", None)
    config.pop("rule", None)
    return config


def settings_key(run) -> str:
    """`settings` as text: runs with equal keys differ only in rule and seed, so they can be
    measured together over seeds (one `seed_table` row per rule)."""
    return json.dumps(settings(run), sort_keys=True, default=str)


def check_distinct_seeds(runs: Iterable[tuple[str, str | None, int | None]]) -> None:
    """Raise ValueError naming both runs when two of the (run, rule, seed) `runs` share a rule
    and a seed: measured together, that seed would count twice (and shrink the standard error).
    Runs without a recorded seed are not compared."""
    seen: dict[tuple[str | None, int], str] = {}
    for name, rule, seed in runs:
        if seed is None:
            continue
        if (rule, seed) in seen:
            raise ValueError(
                f"runs {seen[rule, seed]} and {name} are both rule {rule} on seed {seed}: measured "
                "together, that seed would count twice; leave one of them out"
            )
        seen[rule, seed] = name


def run_outcome(run) -> dict:
    """The outcomes of one run (module docstring) with its rule and seed."""
    run = require_run("run_outcome", run)
    config = run.manifest.get("config") or {}
    rule, seed = rule_and_seed(run)
    acc = accuracy_per_step(run)
    if metrics_only(run):  # imported: its logged metrics (trustlens.analysis.collapse.logged)
        logged = logged_signals(run)
        reward = [(s, r) for s, r in logged.select("step", "reward").drop_nulls().rows() if math.isfinite(r)]
        blocked = f"blocked_{rule or CLIP_RULE}"
        block = logged[blocked].drop_nulls().mean() if blocked in logged.columns else None
        block_low, mm = None, logged.filter(pl.col("k3_kl").is_not_null() | pl.col("prob_diff_mean").is_not_null())
    else:
        reward = reward_per_step(run)
        block, block_low = _block_rates(run, rule)
        mm = mismatch_per_step(run.tokens, aggregates=exact_aggregates(run)).sort("step")
    onset, cause = collapse_onset(acc, reward, collapse_window(len(reward)))
    # the ends are 10% of the steps with token rows, whatever the samples table holds
    w = collapse_window(mm.height)
    k3 = _ends(mm["k3_kl"].to_list(), w)
    tv = _ends(mm["prob_diff_mean"].to_list(), w)
    first = reward[0][0] if reward else 0
    alerts = detect_collapse(run)
    critical = alerts.filter(pl.col("critical_step").is_not_null()).sort("critical_step", "kind")
    first_critical = critical["critical_step"][0] if critical.height else None
    drop, noise = accuracy_drop([a for _, a in acc], config.get("eval_size"))
    return {
        "run": run.name,
        "rule": rule,
        "seed": seed,
        "acc_start": acc[0][1] if acc else None,
        "acc_final": acc[-1][1] if acc else None,
        "acc_best": max(a for _, a in acc) if acc else None,
        "acc_lowest": min(a for _, a in acc) if acc else None,
        "acc_drop": drop,
        "acc_drop_noise": noise,
        "within_noise": None if drop is None or noise is None else drop <= noise,
        "collapse_step": onset,
        "collapse_cause": cause,
        "line_margin": line_margin(acc, cause, config.get("eval_size")),
        "steps_to_collapse": None if onset is None else onset - first,
        "block_rate": block,
        "block_rate_low_mu": block_low,
        "k3_start": k3[0],
        "k3_end": k3[1],
        "tv_start": tv[0],
        "tv_end": tv[1],
        "first_critical": first_critical,
        "first_critical_kind": critical["kind"][0] if critical.height else None,
        "lead": None if onset is None or first_critical is None else onset - first_critical,
    }


OUTCOME_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "run": pl.String,
    "rule": pl.String,
    "seed": pl.Int64,
    **{k: pl.Float64 for k in OUTCOMES if k.startswith("acc_")},
    "acc_drop_noise": pl.Float64,
    "within_noise": pl.Boolean,
    "collapse_step": pl.Int64,
    "collapse_cause": pl.String,
    "line_margin": pl.Float64,
    **{k: pl.Float64 for k in OUTCOMES if not k.startswith("acc_")},
    "first_critical": pl.Int64,
    "first_critical_kind": pl.String,
    "lead": pl.Int64,
}


def run_outcomes(runs) -> pl.DataFrame:
    """`run_outcome` of each run, one row per run (columns: OUTCOME_SCHEMA)."""
    runs = check_sequence("runs", runs, what="a list of Runs (trustlens.load_run)")
    return pl.DataFrame(
        [run_outcome(require_run("run_outcomes", r, f"runs[{i}]")) for i, r in enumerate(runs)], schema=OUTCOME_SCHEMA
    )


def seed_table(outcomes: pl.DataFrame, by: str = "rule") -> pl.DataFrame:
    """Mean ± standard error over the runs of each `by` value (module docstring), in order of
    first appearance: by, n, collapsed, <outcome>_mean, <outcome>_se for each of OUTCOMES.
    Raises ValueError when two runs share a `by` value and a seed (`check_distinct_seeds`)."""
    check_type("outcomes", outcomes, pl.DataFrame, "a polars DataFrame (run_outcomes' table)")
    check_columns("outcomes", outcomes.columns, ["run", check_str("by", by), "seed"])
    check_distinct_seeds(outcomes.select("run", by, "seed").iter_rows())
    rows = []
    for key in outcomes[by].unique(maintain_order=True).to_list():
        part = outcomes.filter(pl.col(by) == key) if key is not None else outcomes.filter(pl.col(by).is_null())
        row: dict = {
            by: key,
            "n": part.height,
            "collapsed": int(part["collapse_step"].is_not_null().sum()),
            "within_noise": int(part["within_noise"].sum()),
        }
        for name in OUTCOMES:
            mean, se, _ = mean_se(part[name].to_list())
            row[f"{name}_mean"], row[f"{name}_se"] = mean, se
        rows.append(row)
    schema: dict[str, pl.DataType | type[pl.DataType]] = {
        by: pl.String,
        "n": pl.Int64,
        "collapsed": pl.Int64,
        "within_noise": pl.Int64,
    }
    schema |= {f"{name}_{s}": pl.Float64 for name in OUTCOMES for s in ("mean", "se")}
    return pl.DataFrame(rows, schema=schema)


def format_mean_se(mean: float | None, se: float | None, digits: int = 3) -> str:
    """'0.412 ± 0.013'; '0.412' without an se; '–' without a mean. Small values in g format."""
    if mean is None:
        return "–"
    fmt = f".{digits}f" if mean == 0 or abs(mean) >= 10 ** (-digits + 1) else f".{digits - 1}e"
    return f"{mean:{fmt}}" if se is None else f"{mean:{fmt}} ± {se:{fmt}}"


def over_seeds(values: Iterable[float | None]) -> str:
    """ "mean ± se (n=k)" of `values` (`mean_se`, `format_mean_se`)."""
    mean, se, n = mean_se(values)
    return f"{format_mean_se(mean, se)} (n={n})"


__all__ = [
    "LINE_MARGIN",
    "LOW_MU",
    "OUTCOMES",
    "OUTCOME_SCHEMA",
    "accuracy_drop",
    "check_distinct_seeds",
    "csv_safe",
    "eval_window",
    "format_mean_se",
    "line_margin",
    "mean_se",
    "over_seeds",
    "rule_and_seed",
    "run_outcome",
    "run_outcomes",
    "seed_table",
    "settings",
    "settings_key",
]
