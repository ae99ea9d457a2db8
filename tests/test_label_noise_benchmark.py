"""benchmarks/label_noise.py on a tiny budget: the extra evaluations leave the training as it
is (the rewards of every step equal a plain run's), and the report has one column per set."""

from pathlib import Path

import polars as pl
import pytest
from benchmark_scripts import load

from trustlens import load_run
from trustlens.train.config import config_from_preset
from trustlens.train.trainer import train

TINY = dict(steps=4, eval_size=16, prompts_per_step=4, group_size=4)


@pytest.fixture(scope="module")
def bench():
    return load("label_noise")


def _rewards(path: Path) -> list[float]:
    samples = load_run(path).samples.collect()
    return samples.group_by("step").agg(pl.col("reward").sum()).sort("step")["reward"].to_list()


def test_extra_evaluations_leave_the_training_as_it_is(bench, tmp_path, capsys):
    bench.train("pg_is", 3, tmp_path / "runs" / "pg_is-seed3", sets=2, every=2, **TINY)
    train(
        config_from_preset("collapse", rule="pg_is", seed=3, eval_every=2, **TINY), tmp_path / "plain", progress=False
    )
    assert _rewards(tmp_path / "runs" / "pg_is-seed3") == _rewards(tmp_path / "plain")
    logged = load_run(tmp_path / "runs" / "pg_is-seed3").metrics.collect()
    names = logged.filter(pl.col("name").str.starts_with(bench.PREFIX))
    assert sorted(names["name"].unique()) == [f"{bench.PREFIX}{s}" for s in ("A", "B0", "B1")]
    assert names.filter(pl.col("name") == f"{bench.PREFIX}A")["step"].sort().to_list() == [0, 2, 4]
    # set A is the run's own held-out set: its accuracy is eval/accuracy, as in a plain run
    plain = load_run(tmp_path / "plain").metrics.filter(pl.col("name") == "eval/accuracy").collect().sort("step")
    ours = names.filter(pl.col("name") == f"{bench.PREFIX}A").sort("step")
    assert ours["value"].to_list() == plain["value"].to_list()
    bench.report(tmp_path / "runs", every=2)
    out = capsys.readouterr().out
    assert "per set: the collapse step / the first critical alert" in out and "pg_is-seed3" in out
    assert out.rstrip().endswith("runs collapse on some sets and not on others")
