"""The shipped sample runs (data/sample_run, `trustlens make-sample`) follow the current
semantics: tokens with A = 0 are never blocked, and the block rates the token rows give (over
A > 0 and A < 0 tokens) are the ones the trainer logged while training."""

from pathlib import Path

import polars as pl
import pytest

from trustlens import load_run
from trustlens.analysis.seeds import run_outcome
from trustlens.train.config import PRESETS

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample_run"
RUNS = sorted(p.name for p in SAMPLE.iterdir() if (p / "run.json").is_file())


def test_the_sample_holds_one_run_per_rule():
    assert RUNS == ["dppo_binary_tv", "pg_is", "ppo"]


@pytest.mark.parametrize("name", RUNS)
def test_sample_run_was_made_by_make_sample_under_the_current_semantics(name):
    run = load_run(SAMPLE / name)
    assert run.status == "finished" and run.manifest["schema_version"] >= 2
    config = run.manifest["config"]
    assert config["rule"] == name
    assert {k: config[k] for k in PRESETS["sample"]} == PRESETS["sample"]
    tokens = run.tokens
    blocked = [c for c in tokens.collect_schema().names() if c.startswith("blocked_")]
    assert len(blocked) >= 12
    zero = tokens.filter(pl.col("advantage") == 0).select(pl.any_horizontal(blocked).sum()).collect().item()
    assert zero == 0, "a token with A = 0 is recorded as blocked"


@pytest.mark.parametrize("name", RUNS)
def test_token_rows_give_the_block_rates_the_trainer_logged(name):
    run = load_run(SAMPLE / name)
    sign = pl.when(pl.col("advantage") > 0).then(pl.lit("pos")).otherwise(pl.lit("neg"))
    blocked = [c for c in run.tokens.collect_schema().names() if c.startswith("blocked_")]
    # the trainer's rate: blocked tokens over the step's tokens of that sign, all updates pooled
    rows = (
        run.tokens.filter(pl.col("advantage") != 0)
        .group_by("step", sign.alias("sign"))
        .agg([pl.col(c).mean().alias(c.removeprefix("blocked_")) for c in blocked])
        .unpivot(index=["step", "sign"], variable_name="rule", value_name="from_tokens")
        .with_columns(name=pl.format("blocked/{}/{}", "rule", "sign"))
        .collect()
    )
    logged = run.metrics.filter(pl.col("name").str.starts_with("blocked/")).collect()
    both = rows.join(logged.select("step", "name", "value"), on=["step", "name"], how="inner")
    assert both.height == rows.height, "a block rate of the token rows was not logged by the trainer"
    assert (both["from_tokens"] - both["value"]).abs().max() < 1e-6


@pytest.mark.parametrize("name", RUNS)
def test_the_sample_carries_only_alerts_that_matter(name):
    # a sample run that collapses gets a critical alert before it; one that does not gets none
    outcome = run_outcome(load_run(SAMPLE / name))
    if outcome["collapse_step"] is None:
        assert outcome["first_critical"] is None
    else:
        assert outcome["lead"] is not None and outcome["lead"] >= 1
