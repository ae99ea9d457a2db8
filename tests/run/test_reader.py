import json
import shutil

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from trustlens import TokenRecorder, load_run, load_runs
from trustlens.run import (
    SCHEMA_VERSION,
    CorruptPartWarning,
    NoRowsError,
    NotARunError,
    Run,
    RunWarning,
    frame_schema,
)


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
    with pytest.raises(NotARunError, match="no such file or directory"):
        load_run(tmp_path / "missing")
    with pytest.raises(NotARunError, match=r"has no run\.json"):
        load_run(tmp_path)


def test_a_folder_of_runs_names_the_runs_inside(tmp_path):
    record_run(tmp_path / "a", steps=1)
    record_run(tmp_path / "group" / "b", steps=1)
    (tmp_path / "group" / "c" / "d" / "too-deep").mkdir(parents=True)  # 4 folders down: not searched
    (tmp_path / "group" / "c" / "d" / "too-deep" / "run.json").write_text("{}")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "run.json").write_text("{}")
    with pytest.raises(NotARunError) as err:
        load_run(tmp_path)
    assert str(err.value) == (
        f"{str(tmp_path)!r} is not a trustlens run: it has no run.json (a run directory is written by "
        f"trustlens.TokenRecorder); it is a folder of 2 runs: give those instead ({tmp_path / 'a'}, "
        f"{tmp_path / 'group' / 'b'})"
    )
    with pytest.raises(
        NotARunError, match=r"has no run\.json \(a run directory is written by trustlens\.TokenRecorder\)$"
    ):
        load_run(tmp_path / "a" / "tokens")  # a folder inside a run holds no run


def test_a_folder_of_many_runs_names_the_first_eight(tmp_path):
    for i in range(10):
        (tmp_path / f"run{i}").mkdir()
        (tmp_path / f"run{i}" / "run.json").write_text("{}")  # listed without being read
    with pytest.raises(NotARunError) as err:
        load_run(tmp_path)
    named = ", ".join(str(tmp_path / f"run{i}") for i in range(8))
    assert str(err.value).endswith(f"it is a folder of 10 runs: give those instead ({named}, and 2 more)")


def test_a_newer_run_holding_runs_is_refused_without_naming_them(tmp_path):
    record_run(tmp_path / "run" / "inner", steps=1)
    (tmp_path / "run" / "run.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(NotARunError) as err:
        load_run(tmp_path / "run")
    assert "upgrade trustlens" in str(err.value) and "inner" not in str(err.value)


def test_corrupt_manifest_warns_and_the_parts_still_load(tmp_path):
    path = record_run(tmp_path / "run", steps=2)
    (path / "run.json").write_text("{not json")
    with pytest.warns(RunWarning, match="run.json' is unreadable.*loading its part files without it"):
        run = load_run(path)
    assert run.status == "unknown" and list(run.rules) == ["ppo", "dppo_binary_tv"]
    assert run.tokens.select(pl.len()).collect().item() == 16
    (path / "run.json").write_text(json.dumps({"hello": 1}))
    with pytest.warns(RunWarning, match="no valid schema_version"):
        assert load_run(path).tokens.select(pl.len()).collect().item() == 16
    with pytest.warns(RunWarning, match="run.json' has no valid schema_version"):
        assert [r.name for r in load_runs(tmp_path)] == ["run"]  # still listed


def test_newer_schema_version_is_refused(tmp_path):
    path = record_run(tmp_path / "run")
    manifest = json.loads((path / "run.json").read_text())
    (path / "run.json").write_text(json.dumps({**manifest, "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(NotARunError, match=f"schema version {SCHEMA_VERSION + 1}.*upgrade trustlens"):
        load_run(path)


def test_run_without_rows(tmp_path):
    rec = TokenRecorder(tmp_path / "run", rules=["ppo"])
    run = load_run(tmp_path / "run")
    with pytest.raises(NoRowsError, match=r"has no token rows yet \(it is still being written"):
        _ = run.tokens
    empty = run.metrics.collect()
    assert empty.height == 0 and empty.schema["value"] == pl.Float64
    assert run.samples.collect_schema()["prompt"] == pl.String
    rec.close()
    with pytest.raises(NoRowsError, match="it is finished"):
        _ = load_run(tmp_path / "run").tokens


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
    # a second rank's shard (rank only in the folder name, as schema 2 writes it)
    (path / "tokens" / "rank=1").mkdir()
    shutil.copy(path / "tokens" / "rank=0" / "part-000000.parquet", path / "tokens" / "rank=1")
    df = load_run(path).tokens.collect()
    assert df.height == 32 and df.group_by("rank").len().sort("rank").rows() == [(0, 16), (1, 16)]
    assert df.columns[:3] == ["step", "update", "rank"] and df.schema["rank"] == pl.Int16


def test_schema_1_runs_still_load(tmp_path):
    """Schema 1 (trustlens 0.1.0) held `rank` as a file column too."""
    path = record_run(tmp_path / "run", steps=2)
    written = pq.read_table(path / "tokens" / "rank=0" / "part-000000.parquet")
    for rank in (0, 1):
        folder = path / "tokens" / f"rank={rank}"
        folder.mkdir(exist_ok=True)
        table = written.add_column(2, "rank", pa.array([rank] * written.num_rows, pa.int16()))
        meta = {**table.schema.metadata, b"trustlens.schema_version": b"1"}
        pq.write_table(table.replace_schema_metadata(meta), folder / "part-000000.parquet")
    manifest = json.loads((path / "run.json").read_text())
    (path / "run.json").write_text(json.dumps({**manifest, "schema_version": 1}))
    df = load_run(path).tokens.collect()
    assert df.group_by("rank").len().sort("rank").rows() == [(0, 16), (1, 16)]


def test_stray_folders_and_files_are_warned_about_and_the_rest_loads(tmp_path):
    path = record_run(tmp_path / "run", steps=2)
    shutil.copytree(path / "tokens" / "rank=0", path / "tokens" / "rank=0 copy")
    (path / "tokens" / "notes.txt").write_text("hi")
    (path / "tokens" / "rank=0" / "part-000000 (1).parquet").write_text("copy")
    with pytest.warns(RunWarning) as caught:
        run = load_run(path)
    named = " ".join(str(w.message) for w in caught)
    for stray in ("rank=0 copy", "notes.txt", "part-000000 (1).parquet"):
        assert stray in named
    assert run.tokens.select(pl.len()).collect().item() == 16
    with pytest.warns(RunWarning):
        assert [r.name for r in load_runs(tmp_path)] == ["run"]


@pytest.mark.parametrize("name", ["sweep-*", "a?b", "[x]", "{a,b}", "r[0-9]*"])
def test_glob_characters_in_run_names_load_exactly_that_run(tmp_path, name):
    record_run(tmp_path / name, steps=1)
    for other in ("sweep-1", "a", "b", "x", "axb", "r1"):  # names the patterns would match
        record_run(tmp_path / other, steps=3)
    assert load_run(tmp_path / name).tokens.select(pl.len()).collect().item() == 8
    assert load_run(tmp_path / name).metrics.collect().height == 1


def test_page_checksums_are_verified(tmp_path):
    path = record_run(tmp_path / "run", steps=3, rows_per_file=8)  # one part per step
    part = path / "tokens" / "rank=0" / "part-000001.parquet"
    meta = pq.read_metadata(part)
    assert meta.row_group(0).column(0).statistics is not None
    data = bytearray(part.read_bytes())
    # flip one byte inside the first data page of the `pi_logp` column: the footer still reads
    column = meta.schema.names.index("pi_logp")
    chunk = meta.row_group(0).column(column)
    at = chunk.data_page_offset + chunk.total_compressed_size - 2
    data[at] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.warns(CorruptPartWarning, match=r"part-000001.parquet.*(CRC|checksum)"):
        run = load_run(path)
    assert sorted(run.tokens.select("step").unique().collect()["step"]) == [0, 2]


def test_load_runs_finds_nested_runs(tmp_path):
    record_run(tmp_path / "a")
    record_run(tmp_path / "group" / "b")
    (tmp_path / "group" / "notes").mkdir()
    (tmp_path / "newer").mkdir()
    (tmp_path / "newer" / "run.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1}))
    (tmp_path / "a" / ".hidden").mkdir()
    with pytest.warns(RunWarning, match="skipping .*newer"):
        runs = load_runs(tmp_path)
    assert [r.name for r in runs] == ["a", "b"]
    assert load_runs(tmp_path / "group" / "notes") == []
    with pytest.raises(NotARunError, match="is not a directory"):
        load_runs(tmp_path / "nothing")


def test_empty_tables_have_the_frame_schema(tmp_path):
    path = record_run(tmp_path / "run", steps=1)
    written = load_run(path).tokens.collect_schema()
    expected = pl.from_arrow(frame_schema("tokens", ["ppo", "dppo_binary_tv"]).empty_table()).schema
    assert list(written.items()) == list(expected.items())
    samples = load_run(path).samples.collect_schema()
    assert list(samples)[:3] == ["step", "rank", "sample"]


def test_file_urls_are_local_paths(tmp_path):
    path = record_run(tmp_path / "run", steps=1)
    assert load_run(f"file://{path}").tokens.select(pl.len()).collect().item() == 8
    assert [r.name for r in load_runs(f"file://{tmp_path}")] == ["run"]
