"""The shipped sample runs (data/sample_run, `trustlens make-sample`): made with the current
settings and semantics (tokens with A = 0 are never blocked; the exact aggregates give the block
rates the trainer logged, and every blocked token is among the kept rows), and telling the story
they are shipped for: a collapse with a critical alert before it, stable rules without one, and
a run that learns."""

from dataclasses import asdict
from pathlib import Path

import polars as pl
import pytest

from trustlens import load_run
from trustlens.analysis.seeds import run_outcome
from trustlens.train.config import TrainConfig
from trustlens.train.sample import SAMPLE_LEARNING, sample_configs

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample_run"
RUNS = sorted(p.name for p in SAMPLE.iterdir() if (p / "run.json").is_file())
RULES = ["dppo_binary_tv", "pg_is", "ppo"]


def test_the_sample_holds_one_run_per_rule_and_a_learning_run():
    assert sorted([*RULES, SAMPLE_LEARNING]) == RUNS


@pytest.mark.parametrize("name", RUNS)
def test_sample_run_was_made_by_make_sample_under_the_current_semantics(name):
    run = load_run(SAMPLE / name)
    assert run.status == "finished" and run.manifest["schema_version"] >= 2
    want = asdict(sample_configs(RULES)[name])
    recorded = run.manifest["config"]
    # settings added since the runs were made are at the defaults that reproduce the old trainer
    # bit for bit (`engine`: "clean", tests/train/test_engine_defects.py; the live alerts' `alerts`,
    # `stop_on`, `checkpoint_every` and `keep_checkpoints`: off, they only read the rows; `flush_seconds`:
    # when rows are written, not which; `keep_rules`: none, the rows the sample's Keep kept; `model`:
    # dense, with the routing settings off: a mixture of experts is a setting of its own)
    added = {key: want.pop(key) for key in set(want) - set(recorded)}
    assert added == {k: v for k, v in asdict(TrainConfig()).items() if k in added}
    assert set(added) <= {
        "engine",
        "alerts",
        "stop_on",
        "checkpoint_every",
        "keep_checkpoints",
        "flush_seconds",
        "warmup_steps",
        "keep_rules",
        "model",
        "routing_replay",
        "routing_split_every",
    }
    assert recorded == want
    assert run.sampled
    tokens = run.tokens
    blocked = [c for c in tokens.collect_schema().names() if c.startswith("blocked_")]
    assert len(blocked) >= 12
    zero = tokens.filter(pl.col("advantage") == 0).select(pl.any_horizontal(blocked).sum()).collect().item()
    assert zero == 0, "a token with A = 0 is recorded as blocked"


@pytest.mark.parametrize("name", RUNS)
def test_the_aggregates_give_the_block_rates_the_trainer_logged(name):
    run = load_run(SAMPLE / name)
    rules = [c.removeprefix("blocked_") for c in run.tokens.collect_schema().names() if c.startswith("blocked_")]
    per_step = run.aggregates.group_by("step").agg(pl.exclude("update").sum()).collect()
    # the trainer's rate: blocked tokens over the step's tokens of that sign, all updates pooled
    rates = per_step.select(
        "step",
        *(
            (pl.col(f"k_{r}_{s}") / pl.col(f"tokens_{s}")).alias(f"blocked/{r}/{s}")
            for r in rules
            for s in ("pos", "neg")
        ),
    ).unpivot(index="step", variable_name="name", value_name="from_aggregates")
    logged = run.metrics.filter(pl.col("name").str.starts_with("blocked/")).collect()
    both = rates.drop_nulls().join(logged.select("step", "name", "value"), on=["step", "name"], how="inner")
    assert both.height == rates.drop_nulls().height > 0, "a block rate of the aggregates was not logged"
    assert (both["from_aggregates"] - both["value"]).abs().max() < 1e-6
    # every blocked token is kept (weight 1): the rows count exactly what the aggregates do
    sign = pl.when(pl.col("advantage") > 0).then(pl.lit("pos")).otherwise(pl.lit("neg"))
    counted = (
        run.tokens.filter(pl.col("advantage") != 0)
        .group_by("step", sign.alias("sign"))
        .agg(pl.col(f"blocked_{r}").sum().alias(r) for r in rules)
        .collect()
    )
    for s in ("pos", "neg"):
        rows = counted.filter(pl.col("sign") == s).sort("step")
        exact = per_step.filter(pl.col("step").is_in(rows["step"].implode())).sort("step")
        for r in rules:
            assert rows[r].to_list() == exact[f"k_{r}_{s}"].to_list(), (r, s)


def test_the_sample_tells_the_story():
    outcomes = {name: run_outcome(load_run(SAMPLE / name)) for name in RUNS}
    # pg_is (no trust region) collapses, warned ahead; DPPO and PPO do not, and get no critical alert
    assert outcomes["pg_is"]["collapse_step"] is not None
    assert outcomes["pg_is"]["lead"] is not None and outcomes["pg_is"]["lead"] >= 1
    for name in ("dppo_binary_tv", "ppo", SAMPLE_LEARNING):
        assert outcomes[name]["collapse_step"] is None and outcomes[name]["first_critical"] is None, name
    # the default run learns: ≥ 5 points of held-out accuracy over its start
    learning = outcomes[SAMPLE_LEARNING]
    assert learning["acc_final"] - learning["acc_start"] >= 0.05


def test_every_file_of_the_sample_is_installed_with_the_package():
    # pyproject's data-files list one glob per folder: a run or a table the list misses would be
    # in the repository but not in an installed trustlens
    import fnmatch

    import tomllib

    root = SAMPLE.parent.parent
    data_files = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    globs = [g for patterns in data_files.values() for g in patterns]
    shipped = [p.relative_to(root).as_posix() for p in SAMPLE.rglob("*") if p.is_file() and p.name[0] != "."]
    assert shipped and [f for f in shipped if not any(fnmatch.fnmatch(f, g) for g in globs)] == []
