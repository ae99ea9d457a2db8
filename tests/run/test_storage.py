"""Runs on an object store: a local S3 server (moto) on 127.0.0.1 (tests/s3_server.py)."""

import polars as pl
import pytest
import torch
from s3_server import BUCKET, keys

from trustlens import TokenRecorder, load_run, load_runs
from trustlens.run.storage import Remote
from trustlens.synthetic import write_synthetic_run


def record(rec, step: int) -> None:
    mu = -torch.rand(2, 3) - 0.1
    rec.record(
        step,
        token_ids=torch.zeros(2, 3, dtype=torch.long),
        response_mask=torch.ones(2, 3),
        pi_logp=mu,
        mu_logp=mu,
        advantages=torch.ones(2),
    )
    rec.log_metrics(step, {"loss": float(step)})


def test_recorder_writes_objects_and_load_run_reads_them(s3):
    url = f"s3://{BUCKET}/runs/exp1"
    with TokenRecorder(url, rules=["ppo"], rows_per_file=6) as rec:
        assert isinstance(rec.path, Remote) and rec.path.url == url
        for step in range(2):
            record(rec, step)
    assert keys(s3, "runs/exp1/") == [
        "metrics/rank=0/part-000000.parquet",
        "run.json",
        "tokens/rank=0/part-000000.parquet",
        "tokens/rank=0/part-000001.parquet",
    ]
    run = load_run(url)
    assert run.status == "finished" and run.name == "exp1"
    df = run.tokens.collect()
    assert df.height == 12 and df["rank"].to_list() == [0] * 12 and sorted(set(df["step"])) == [0, 1]
    assert run.metrics.collect().sort("step")["value"].to_list() == [0.0, 1.0]

    with TokenRecorder(url, rules=["ppo"], resume=True) as rec:  # resume works there too
        record(rec, 2)
    assert load_run(url).tokens.select(pl.len()).collect().item() == 18
    assert "tokens/rank=0/part-000002.parquet" in keys(s3, "runs/exp1/")


def test_load_runs_and_synthetic_runs_on_the_store(s3):
    write_synthetic_run(f"s3://{BUCKET}/sweep/a", steps=2, samples_per_step=8, seq_len=6, world_size=2)
    write_synthetic_run(f"s3://{BUCKET}/sweep/b", steps=3, samples_per_step=8, seq_len=6)
    assert "a/tokens/rank=1/part-000000.parquet" in keys(s3, "sweep/")
    runs = load_runs(f"s3://{BUCKET}/sweep")
    assert [r.name for r in runs] == ["a", "b"]
    ranks = runs[0].tokens.group_by("rank").len().collect()
    assert sorted(ranks["rank"]) == [0, 1]
    assert runs[1].tokens.select(pl.col("step").max()).collect().item() == 2
    with pytest.raises(
        ValueError, match=rf"a folder of 2 runs: give those instead \(s3://{BUCKET}/sweep/a, s3://{BUCKET}/sweep/b\)$"
    ):
        load_run(f"s3://{BUCKET}/sweep")


def test_unknown_or_missing_filesystems_are_named():
    with pytest.raises(ValueError, match="no filesystem for 'nosuchfs'"):
        load_run("nosuchfs://bucket/run")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="needs the 'gs' filesystem: pip install gcsfs"):
            load_run("gs://bucket/run")
