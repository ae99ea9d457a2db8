import json
import shutil

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from trustlens import TokenRecorder, load_run, load_runs
from trustlens.run import CorruptPartWarning, NoRowsError, NotARunError, Run
from trustlens.run import SCHEMA_VERSION, table_schema


def record_run(path, steps=3, rows_per_file=10**6, rules=("ppo", "dppo_binary_tv")):
    """A small real run: 2 samples × 4 positions per step, every position valid."""
    g = torch.Generator().manual_seed(0)
    with TokenRecorder(path, rules=list(rules), rows_per_file=rows_per_file) as rec:
        for step in range(steps):
            mu = -torch.rand(2, 4, generator=g) - 0.1
            rec.record(
                step,
                token_ids=torch.randint(0, 9, (2, 4), generator=g),
                response_mask=torch.ones(2, 4),
                pi_logp=mu * 0.9,
                mu_logp=mu,
                advantages=torch.tensor([1.0, -1.0]),
            )
            rec.log_metrics(step, {"reward/mean": float(step)})
    return path


def test_load_run_exposes_tables_manifest_and_rules(tmp_path):
    run = load_run(record_run(tmp_path / "run"))
    assert isinstance(run, Run) and run.path == tmp_path / "run" and run.name == "run"
    assert run.status == "finished" and run.active_rule is None
    assert list(run.rules) == ["ppo", "dppo_binary_tv"] and run.rules["ppo"]["high"] == 0.2
    assert isinstance(run.tokens, pl.LazyFrame)
    assert run.tokens.select(pl.len()).collect().item() == 24
    assert run.metrics.collect().sort("step")["value"].to_list() == [0.0, 1.0, 2.0]
    assert run.samples.collect().height == 0
    assert load_run(tmp_path / "run" / "run.json").path == run.path  # the manifest's path works too


def test_not_a_run(tmp_path):
    with pytest.raises(NotARunError, match="no such directory"):
        load_run(tmp_path / "missing")
    with pytest.raises(NotARunError, match="has no run.json"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(NotARunError, match="run.json' is unreadable"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(NotARunError, match="no integer schema_version"):
        load_run(tmp_path)


def test_newer_schema_version_is_refused(tmp_path):
    path = record_run(tmp_path / "run")
    manifest = json.loads((path / "run.json").read_text())
    (path / "run.json").write_text(json.dumps({**manifest, "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(NotARunError, match=f"schema version {SCHEMA_VERSION + 1}.*upgrade trustlens"):
        load_run(path)


def test_run_without_rows(tmp_path):
    rec = TokenRecorder(tmp_path / "run", rules=["ppo"])
    run = load_run(tmp_path / "run")
    with pytest.raises(NoRowsError, match="has no token rows yet \\(it is still being written"):
        run.tokens
    empty = run.metrics.collect()
    assert empty.height == 0 and empty.schema["value"] == pl.Float64
    assert run.samples.collect_schema()["prompt"] == pl.String
    rec.close()
    with pytest.raises(NoRowsError, match="it is finished"):
        load_run(tmp_path / "run").tokens


def test_corrupt_and_truncated_parts_are_skipped_with_a_warning(tmp_path):
    path = record_run(tmp_path / "run", steps=3, rows_per_file=8)  # one part per step
    shard = path / "tokens" / "rank=0"
    parts = sorted(shard.iterdir())
    assert len(parts) == 3
    data = parts[1].read_bytes()
    parts[1].write_bytes(data[: len(data) // 2])  # truncated
    parts[2].write_bytes(b"garbage" * 10)  # corrupt
    with pytest.warns(CorruptPartWarning) as caught:
        run = load_run(path)
    named = " ".join(str(w.message) for w in caught)
    assert str(parts[1]) in named and str(parts[2]) in named
    assert run.tokens.select("step").unique().collect()["step"].to_list() == [0]


def test_unfinished_temporary_parts_are_ignored(tmp_path):
    path = record_run(tmp_path / "run", steps=1)
    shard = path / "tokens" / "rank=0"
    shutil.copy(shard / "part-000000.parquet", shard / ".part-000001.parquet.tmp")
    assert load_run(path).tokens.select(pl.len()).collect().item() == 8


def test_ranks_read_as_one_table(tmp_path):
    path = record_run(tmp_path / "run", steps=2)
    # a second rank's shard, written like the recorder would
    table = pq.read_table(path / "tokens" / "rank=0" / "part-000000.parquet")
    table = table.set_column(table.schema.get_field_index("rank"), "rank", pa.array([1] * table.num_rows, pa.int16()))
    (path / "tokens" / "rank=1").mkdir()
    pq.write_table(table, path / "tokens" / "rank=1" / "part-000000.parquet")
    df = load_run(path).tokens.collect()
    assert df.height == 32 and sorted(set(df["rank"])) == [0, 1]


def test_load_runs_finds_nested_runs(tmp_path):
    record_run(tmp_path / "a")
    record_run(tmp_path / "group" / "b")
    (tmp_path / "group" / "notes").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.json").write_text("{")
    with pytest.warns(UserWarning, match="skipping .*broken"):
        runs = load_runs(tmp_path)
    assert [r.name for r in runs] == ["a", "b"]
    assert load_runs(tmp_path / "group" / "notes") == []
    with pytest.raises(NotARunError, match="is not a directory"):
        load_runs(tmp_path / "nothing")


def test_empty_tables_have_the_file_schema(tmp_path):
    path = record_run(tmp_path / "run", steps=1)
    written = load_run(path).tokens.collect_schema()
    expected = pl.from_arrow(table_schema("tokens", ["ppo", "dppo_binary_tv"]).empty_table()).schema
    assert dict(written) == dict(expected)
