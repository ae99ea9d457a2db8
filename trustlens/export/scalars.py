"""The per-step scalars an export or a live mirror sends to TensorBoard or W&B.

One function computes them for both: `step_scalars`, of a recorded run or of the rows of the
steps a mirror has seen while training (the logged metrics, then what the token rows add or,
when they are a sample, the aggregates); `token_scalars` is what an unsampled run's rows add.
Names follow the registry (`trustlens.metrics`, docs/metrics.md):

    blocked/<rule>/pos, blocked/<rule>/neg   share of the step's A > 0 (A < 0) tokens the rule
                                             blocks; A = 0 tokens are never blocked and not counted
    zero_adv_frac                            share of the step's tokens with A = 0
    mismatch_kl, k3_kl, ... prob_pearson     the training–inference mismatch of μ vs π_old
                                             (trustlens.analysis.mismatch_per_step)
    reward/mean, eval/accuracy, ...          every metric the run logged (mean over ranks)

The top-K mismatch (topk_tv_mean, topk_tv_max, topk_kl_mean: μ vs π_old, from π_old's logits)
is sent only as the run logged it (the built-in trainer does), sampled or not: the token columns
topk_tv and topk_kl, and the aggregates' sums of them, are μ vs π, the policy being updated.

A value computed from the records wins over a logged value of the same step and name: it is
exact over every token the run recorded, and it is the number the dashboard shows. Logged values
(read by `trustlens.analysis.mismatch.logged_per_step`, as the dashboard reads them) fill in the
names and steps the records give no value for. The built-in trainer's logged block rates and
token means equal the records' (they are pooled over ranks: trustlens.train.pooled); a
logged value that differs is another quantity under the registry's name (a mean of per-rank
rates, a subset of the tokens), and is not sent. External trainers log under their own prefixes
(verl/, openrlhf/, TRL's names), so nothing of theirs is replaced. A run recorded with `Keep`
(sampled token rows, the mirror's too) gets the computed ones from its exact aggregates
(trustlens.run.aggregates.per_step_scalars); the sequence-level mismatch metrics (log_ppl_diff,
log_ppl_abs_diff, chi2_seq) need every token of a response: such a run sends only those it
logged (the built-in trainer logs all three).

`shard=True` is for rows that are one rank's shard of each step (a live mirror on rank 0 of a
data-parallel run, whose trainer logs values reduced over all ranks): there a logged value wins
over the one computed from the shard.
"""

from __future__ import annotations

import polars as pl

from trustlens.analysis.buckets import zero_advantage_frac
from trustlens.analysis.mismatch import logged_per_step, mismatch_per_step
from trustlens.core.argument_checks import check_type
from trustlens.core.render import escape_markdown
from trustlens.metrics import MISMATCH_METRICS, blocked_frac, blocked_rate
from trustlens.run import BLOCKED_PREFIX, NoRowsError
from trustlens.run.aggregates import per_step_scalars

SCHEMA = {"step": pl.Int64, "name": pl.String, "value": pl.Float64}


def token_scalars(tokens: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """Per-step scalars from token rows: step, name, value (block rates by sign, zero_adv_frac,
    mismatch metrics where μ and π_old are both recorded), sorted by step then name. The rates
    are plain means over the rows: for all of a step's tokens, not a sample's kept rows
    (`step_scalars` takes a sampled run's from its aggregates); of weighted rows, the
    sequence-level mismatch metrics are left out (`mismatch_per_step`)."""
    check_type("tokens", tokens, (pl.LazyFrame, pl.DataFrame), "a polars LazyFrame or DataFrame of token rows")
    tokens = tokens.lazy()
    names = tokens.collect_schema().names()
    if "advantage" not in names:
        return pl.DataFrame(schema=SCHEMA)
    rules = [c.removeprefix(BLOCKED_PREFIX) for c in names if c.startswith(BLOCKED_PREFIX)]
    adv = pl.col("advantage")
    sign = pl.when(adv > 0).then(pl.lit("pos")).otherwise(pl.lit("neg")).alias("sign")
    rates = (
        tokens.filter(adv.is_not_null() & (adv != 0))
        .group_by("step", sign)
        .agg(pl.col(BLOCKED_PREFIX + r).cast(pl.Float64).mean().alias(r) for r in rules)
        .unpivot(index=["step", "sign"], variable_name="rule", value_name="value")
        .collect(engine="streaming")
    )
    parts = [
        rates.select(
            "step",
            pl.struct("rule", "sign")
            .map_elements(lambda s: blocked_rate(s["rule"], s["sign"]), pl.String)
            .alias("name"),
            "value",
        ),
        tokens.group_by("step").agg(zero_advantage_frac()).collect(engine="streaming"),
    ]
    parts[1] = parts[1].unpivot(index="step", variable_name="name", value_name="value")
    if {"mu_logp", "old_logp"} <= set(names):
        mismatch = mismatch_per_step(tokens).select("step", *MISMATCH_METRICS)
        parts.append(mismatch.unpivot(index="step", variable_name="name", value_name="value"))
    return _long(parts)


def step_scalars(run, *, shard: bool = False) -> pl.DataFrame:
    """Per-step scalars of a recorded run (module docstring): step, name, value. `run`: a Run,
    or anything with its `metrics`, `tokens`, `aggregates` and `sampled`. Where both give a
    value for a step and name, the records' wins over the logged one; with `shard` (the rows are
    one rank's of several), the logged one wins. NaN (no value) is left out; ±inf is a value."""
    if not all(hasattr(run, a) for a in ("metrics", "tokens", "sampled")):
        raise TypeError(f"step_scalars: run must be a Run (trustlens.load_run), got {type(run).__name__} {run!r:.80}")
    logged = _long([logged_per_step(run.metrics)]).filter(pl.col("value").is_not_nan())  # NaN: no value
    if run.sampled:  # exact, from the aggregates of all tokens
        exact = per_step_scalars(run.aggregates)
        computed = pl.DataFrame(
            [(step, name, value) for step, values in exact.items() for name, value in values.items()],
            schema=SCHEMA,
            orient="row",
        )
    else:
        try:
            computed = token_scalars(run.tokens)
        except NoRowsError:
            computed = pl.DataFrame(schema=SCHEMA)
    computed = _long([computed]).filter(pl.col("value").is_not_nan())
    if shard:
        computed = computed.join(logged, on=["step", "name"], how="anti")
    else:
        logged = logged.join(computed, on=["step", "name"], how="anti")
    return _long([logged, computed])


# the text tag run.json's settings are exported under (tensorboardX adds /text_summary), and those
# settings: what the alerts of the run depend on, restored by `trustlens import`
RUN_TAG = "trustlens/run"
RUN_SETTINGS = ("rules", "active_rule", "model_kind", "planned_steps", "warmup_steps", "config", "sampling")


def run_settings(run) -> dict:
    """The RUN_SETTINGS of a run's run.json (those it has)."""
    manifest = getattr(run, "manifest", None) or {}
    return {k: manifest[k] for k in RUN_SETTINGS if k in manifest}


def signal_scalars(signals: pl.DataFrame) -> pl.DataFrame:
    """The collapse alerts' per-step signals (trustlens.analysis.step_signals) that no other
    scalar carries, under their registry names: `entropy` (of π over the recorded tokens) and
    `blocked_frac/<rule>` (the share of A ≠ 0 tokens each rule blocks, both signs). With them an
    imported export gives the alerts of the run (trustlens.analysis.collapse.logged)."""
    names = {"entropy": "entropy"} | {
        c: blocked_frac(c.removeprefix("blocked_")) for c in signals.columns if c.startswith("blocked_")
    }
    present = [c for c in names if c in signals.columns]
    if not present:
        return pl.DataFrame(schema=SCHEMA)
    long = signals.select("step", *present).unpivot(index="step", variable_name="name", value_name="value")
    return _long([long.with_columns(pl.col("name").replace_strict(names, return_dtype=pl.String))]).filter(
        pl.col("value").is_not_nan()
    )


def with_signals(scalars: pl.DataFrame, signals: pl.DataFrame) -> pl.DataFrame:
    """`scalars` (step_scalars) and the signal_scalars of `signals` they lack: what an export sends."""
    extra = signal_scalars(signals).join(scalars, on=["step", "name"], how="anti")
    return pl.concat([scalars, extra]).sort("step", "name")


def alert_text(alerts: pl.DataFrame) -> dict[int, str]:
    """The collapse alerts (trustlens.analysis.detect_collapse) as Markdown, one text per step.
    Alert messages name rules read from the run: escaped, so that they render as text."""
    check_type("alerts", alerts, pl.DataFrame, "a polars DataFrame of alerts (trustlens.analysis.detect_collapse)")
    lines: dict[int, list[str]] = {}
    for a in alerts.iter_rows(named=True):
        line = f"**{a['severity']}** {escape_markdown(a['kind'])} (steps {a['step']}–{a['end_step']}): "
        lines.setdefault(int(a["step"]), []).append(line + escape_markdown(a["message"]))
    return {step: "\n\n".join(text) for step, text in sorted(lines.items())}


def _long(parts: list[pl.DataFrame]) -> pl.DataFrame:
    frames = [
        p.select(pl.col("step").cast(pl.Int64), pl.col("name").cast(pl.String), pl.col("value").cast(pl.Float64))
        for p in parts
    ]
    out = pl.concat(frames) if frames else pl.DataFrame(schema=SCHEMA)
    return out.filter(pl.col("value").is_not_null()).sort("step", "name")


__all__ = [
    "RUN_SETTINGS",
    "RUN_TAG",
    "SCHEMA",
    "alert_text",
    "run_settings",
    "signal_scalars",
    "step_scalars",
    "token_scalars",
    "with_signals",
]
