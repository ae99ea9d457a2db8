"""Queries over recorded runs (polars): a run's LazyFrames in, small DataFrames out.

Modules, each documenting its return columns:
    clipping   which tokens each rule blocks: per step, by token text, by μ-probability bucket,
               by advantage sign; Figure-1 densities and rule boundaries; rules the run did not
               record, decided on its columns (with_rules)
    agreement  two rules' decisions compared on the same tokens (rule_confusion, confusion_matrix)
    mismatch   training-inference mismatch (μ vs π_old) per step, per μ bucket and its trend
               (names from trustlens.metrics, which maps them to verl's)
    collapse   collapse alerts (detect_collapse): its config, the per-step signals they watch,
               the detectors, their levels, the tokens and samples that drove an alert, the
               collapse itself (collapse_onset) and a run's timeline; docs/alerts.md
    doctor     log-probability bugs that fake a training–inference mismatch (doctor, Finding)
    certify    μ = π_old bit for bit, the verdict on a zero-mismatch engine (certify, Certificate)
    seeds      per-run outcomes and their mean ± standard error over seeds (trustlens compare)
    seed_text  the seed table as terminal text in blocks of ≤ 120 columns, with a legend
    claims     the DPPO paper's six claims measured on a set of runs (trustlens claims);
               claims_text, the claims report's text about each run's outcome
    paper_findings  the paper's findings located in a run (motivating examples, where blocked
               tokens sit)
    sweep      what each rule blocks with its thresholds scaled (threshold_sweep)
    responses  decisions counted per response: a sequence rule blocks whole responses
               (responses_blocked)
    summary    the per-step summary of a run (the dashboard's overview table); a sampled run's
               exact aggregates (exact_aggregates) for the `aggregates` argument

    tokens     token-inspector filters and one sample's tokens
    buckets    log-spaced probability buckets and shared helpers

Every query takes a `Run` (`load_run`) or its token rows (`run.tokens`, a LazyFrame); those that
need the run's metrics or manifest (`detect_collapse`, `step_signals`, `run_outcomes`) take the
`Run` (anything else is a TypeError naming the argument: `sources`).

A sampled run (recorded with `Keep`): given the `Run`, `step_summary`, `blocked_per_step`,
`mismatch_per_step` and `rule_confusion` take their counts, block rates and token-level mismatch
from the run's exact aggregates of all tokens, as the dashboard shows them (given only
`run.tokens`, pass `aggregates=run.aggregates` for the same). Everything else, and those four's
columns the aggregates do not hold (the sequence-level mismatch, entropy where not summed), is
estimated from the kept rows, each counted with its sampling weight.

Every query runs on polars' streaming engine and prunes by step where it filters on steps, so
it works on runs of any size (the live monitor, judging one step's rows in memory, runs the same
queries on the in-memory engine: `trustlens.analysis.buckets.in_memory`); none returns more rows
than steps × rules or buckets × rules.
"""

from trustlens.analysis.agreement import confusion_matrix, rule_confusion
from trustlens.analysis.buckets import bucket_table
from trustlens.analysis.certify import Certificate, certify
from trustlens.analysis.clipping import (
    blocked_by_advantage_sign,
    blocked_by_bucket,
    blocked_by_token,
    blocked_per_step,
    figure1_density,
    rule_boundaries,
    with_rules,
)
from trustlens.analysis.collapse import CollapseConfig, detect_collapse
from trustlens.analysis.collapse.onset import collapse_onset
from trustlens.analysis.collapse.signals import step_signals
from trustlens.analysis.diagnosis import Finding, doctor
from trustlens.analysis.mismatch import (
    MISMATCH_COLUMNS,
    MismatchTrend,
    mismatch_by_bucket,
    mismatch_by_staleness,
    mismatch_per_step,
    mismatch_trend,
    mismatch_unavailable,
)
from trustlens.analysis.paper_findings import (
    blocked_anchor_quantiles,
    blocked_token_anchor,
    motivating_examples,
    over_updates_per_step,
)
from trustlens.analysis.responses import responses_blocked
from trustlens.analysis.seeds import run_outcomes, seed_table
from trustlens.analysis.summary import exact_aggregates, step_summary
from trustlens.analysis.sweep import threshold_sweep

__all__ = [
    "MISMATCH_COLUMNS",
    "Certificate",
    "CollapseConfig",
    "Finding",
    "MismatchTrend",
    "blocked_anchor_quantiles",
    "blocked_by_advantage_sign",
    "blocked_by_bucket",
    "blocked_by_token",
    "blocked_per_step",
    "blocked_token_anchor",
    "bucket_table",
    "certify",
    "collapse_onset",
    "confusion_matrix",
    "detect_collapse",
    "doctor",
    "exact_aggregates",
    "figure1_density",
    "mismatch_by_bucket",
    "mismatch_by_staleness",
    "mismatch_per_step",
    "mismatch_trend",
    "mismatch_unavailable",
    "motivating_examples",
    "over_updates_per_step",
    "responses_blocked",
    "rule_boundaries",
    "rule_confusion",
    "run_outcomes",
    "seed_table",
    "step_signals",
    "step_summary",
    "threshold_sweep",
    "with_rules",
]
