"""Runs on an object store: a local S3 server (moto) on 127.0.0.1, started here."""

import socket

import polars as pl
import pytest
import torch

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")
pytest.importorskip("s3fs")

from trustlens import TokenRecorder, load_run, load_runs  # noqa: E402
from trustlens.run.storage import Remote  # noqa: E402
from trustlens.synthetic import write_synthetic_run  # noqa: E402

BUCKET = "trustlens-test"


@pytest.fixture(scope="module")
def endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(endpoint, monkeypatch, tmp_path):
    """Credentials and endpoint from the standard environment variables; a fresh bucket."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # a run written to a local folder named "s3:" would land here
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=BUCKET)
    yield client
    for obj in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    client.delete_bucket(Bucket=BUCKET)
    assert not (tmp_path / "s3:").exists()


def keys(client, prefix: str) -> list[str]:
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"][len(prefix) :] for o in listed)


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


def test_unknown_or_missing_filesystems_are_named():
    with pytest.raises(ValueError, match="no filesystem for 'nosuchfs'"):
        load_run("nosuchfs://bucket/run")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="needs the 'gs' filesystem: pip install gcsfs"):
            load_run("gs://bucket/run")
