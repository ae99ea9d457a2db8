"""Every public analysis takes a `Run` as well as its token rows; given a sampled run's `Run`, the
four with exact forms use its aggregates; anything else is a TypeError naming the argument."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import trustlens.analysis as analysis
from trustlens import load_run

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample_run"

# analyses of token rows: (name, extra positional args)
TOKEN_ANALYSES = [
    ("blocked_per_step", ()),
    ("blocked_by_token", ()),
    ("blocked_by_bucket", ()),
    ("blocked_by_advantage_sign", ()),
    ("confusion_matrix", ()),
    ("figure1_density", ()),
    ("mismatch_per_step", ()),
    ("mismatch_by_bucket", ()),
    ("mismatch_by_staleness", ()),
    ("mismatch_unavailable", ()),
    ("rule_confusion", ("ppo", "dppo_binary_tv")),
    ("step_summary", ()),
    ("threshold_sweep", ("ppo", (0.5, 1.0))),
    ("with_rules", (["dppo_binary_kl"],)),
    ("motivating_examples", ()),
    ("blocked_anchor_quantiles", ()),
    ("blocked_token_anchor", ()),
    ("over_updates_per_step", ()),
]
EXACT = {"blocked_per_step", "mismatch_per_step", "rule_confusion", "step_summary"}


@pytest.fixture(scope="module")
def sampled_run():
    run = load_run(SAMPLE / "dppo_binary_tv")
    assert run.sampled
    return run


def _frame(result):
    return result.collect() if isinstance(result, pl.LazyFrame) else result


def test_every_analysis_is_exported():
    for name, _ in TOKEN_ANALYSES:
        assert name in analysis.__all__, name
    assert "threshold_sweep" in analysis.__all__


@pytest.mark.parametrize(("name", "args"), TOKEN_ANALYSES)
def test_a_run_gives_what_its_rows_give(sampled_run, name, args):
    """Given the Run: the exact form with the run's aggregates where there is one, else the same
    estimate as from its token rows."""
    fn = getattr(analysis, name)
    got = fn(sampled_run, *args)
    if name in EXACT:
        want = fn(sampled_run.tokens, *args, aggregates=sampled_run.aggregates)
    else:
        want = fn(sampled_run.tokens, *args)
    if isinstance(want, (pl.DataFrame, pl.LazyFrame)):
        assert _frame(got).equals(_frame(want)), name
    else:
        assert got == want


def test_the_obvious_call_gives_the_exact_mismatch(sampled_run):
    """k3 at step 236 of the shipped sampled run: 0.1705 as the trainer logged it, not the 0.585
    that the kept rows estimate."""
    logged = sampled_run.metrics.filter((pl.col("step") == 236) & (pl.col("name") == "k3_kl")).collect()["value"]
    exact = analysis.mismatch_per_step(sampled_run).filter(pl.col("step") == 236)["k3_kl"].item()
    estimate = analysis.mismatch_per_step(sampled_run.tokens).filter(pl.col("step") == 236)["k3_kl"].item()
    assert exact == pytest.approx(logged.item(), rel=1e-6)
    assert exact == pytest.approx(0.1705, abs=5e-5)
    assert estimate == pytest.approx(0.585, abs=5e-4)


def test_step_summary_of_a_run_counts_every_token(sampled_run):
    exact = analysis.step_summary(sampled_run)
    totals = sampled_run.aggregates.group_by("step").agg(pl.col("tokens").sum()).collect()
    joined = exact.join(totals, on="step", suffix="_agg")
    assert (joined["tokens"] == joined["tokens_agg"]).all()


def test_an_explicit_aggregates_argument_wins(sampled_run):
    few = sampled_run.aggregates.filter(pl.col("step") < 10)
    got = analysis.blocked_per_step(sampled_run, aggregates=few)
    assert got["step"].max() < 10


@pytest.mark.parametrize(("name", "args"), TOKEN_ANALYSES)
@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (None, "NoneType"),
        ("runs/demo", "load_run"),
        (Path("runs/demo"), "load_run"),
        (pl.DataFrame({"step": [0]}), "DataFrame"),
        ({"tokens": 1}, "dict"),
    ],
)
def test_anything_else_is_a_type_error_naming_the_argument(name, args, bad, said):
    with pytest.raises(TypeError, match=rf"{name}: tokens must be a Run .*{said}"):
        getattr(analysis, name)(bad, *args)


@pytest.mark.parametrize("name", ["detect_collapse", "step_signals"])
def test_run_analyses_refuse_token_rows(sampled_run, name):
    with pytest.raises(TypeError, match=rf"{name}: run must be the Run .*not its token rows"):
        getattr(analysis, name)(sampled_run.tokens)
    with pytest.raises(TypeError, match=rf"{name}: run must be a Run .*load_run"):
        getattr(analysis, name)("data/sample_run/pg_is")


def test_run_outcomes_refuse_token_rows(sampled_run):
    with pytest.raises(TypeError, match=r"run_outcomes: runs\[0\] must be the Run"):
        analysis.run_outcomes([sampled_run.tokens])
