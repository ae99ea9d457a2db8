"""Bad inputs to reading runs: paths that are not runs, and part files whose schema differs from
the run's (issues 32 and 39): the run still loads, the part read with what it has (a warning
naming the file and the columns) or skipped with a warning naming the file; a run.json without a
key the analyses read (a warning saying what is lost); ranks written with different world sizes
(refused, naming both)."""

from __future__ import annotations

import re
import warnings

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from trustlens.run import NotARunError, RunWarning, load_run, load_runs
from trustlens.run.tables import write_run


@pytest.mark.parametrize(
    ("path", "error", "named"),
    [
        (None, TypeError, "path"),
        ("", ValueError, "path"),
        (3, TypeError, "path"),
        (b"/tmp", TypeError, "path"),
        (["/tmp"], TypeError, "path"),
    ],
)
def test_load_run_names_the_path(path, error, named):
    with pytest.raises(error, match=named):
        load_run(path)


@pytest.mark.parametrize(("folder", "error"), [(None, TypeError), ("", ValueError), (1.5, TypeError)])
def test_load_runs_names_the_folder(folder, error):
    with pytest.raises(error, match="folder"):
        load_runs(folder)


def test_a_missing_directory_is_not_a_run(tmp_path):
    with pytest.raises(NotARunError, match="no such file or directory"):
        load_run(tmp_path / "nope")


def _two_part_run(tmp_path):
    """A run of two token parts (steps 0 and 1, two rows each) on ranks 0 and 1."""
    path = write_run(
        tmp_path / "run",
        tokens={
            "step": [0, 0, 1, 1],
            "sample": [0, 0, 1, 1],
            "pos": [0, 1, 0, 1],
            "rank": [0, 0, 1, 1],
            "pi_logp": [-1.0, -2.0, -1.5, -0.5],
            "mu_logp": [-1.0, -1.0, -1.0, -1.0],
            "blocked_ppo": [False, True, False, True],
        },
        samples={"step": [0, 1], "sample": [0, 1], "reward": [1.0, 0.0], "rank": [0, 1]},
        metrics={"step": [0, 1], "name": ["a", "a"], "value": [1.0, 2.0], "rank": [0, 1]},
    )
    return path


def _edit(path, table: str, rank: int, change):
    part = next((path / table / f"rank={rank}").glob("part-*.parquet"))
    pq.write_table(change(pq.read_table(part)), part)
    return part


CHANGES = {  # name -> (table, change, the column that comes back null on rank 1 or None, what the warning says)
    "column dropped": ("tokens", lambda t: t.drop_columns(["pi_logp"]), "pi_logp", r"missing, read as null: pi_logp\)"),
    "column added": (
        "tokens",
        lambda t: t.append_column("extra", pa.array([1, 2])),
        None,
        r"not the run's, dropped: extra\)",
    ),
    "column renamed": (
        "tokens",
        lambda t: t.rename_columns(["mu_logp2" if n == "mu_logp" else n for n in t.column_names]),
        "mu_logp",
        r"missing, read as null: mu_logp; not the run's, dropped: mu_logp2\)",
    ),
    "float widened": (
        "tokens",
        lambda t: t.set_column(t.schema.get_field_index("pi_logp"), "pi_logp", pc.cast(t["pi_logp"], pa.float64())),
        None,
        r"cast to the run's type: pi_logp \(Float64 to Float32\)\)",
    ),
    "int widened": (
        "tokens",
        lambda t: t.set_column(t.schema.get_field_index("pos"), "pos", pc.cast(t["pos"], pa.int64())),
        None,
        r"cast to the run's type: pos \(Int64 to Int\d+\)\)",
    ),
    "columns reordered": ("tokens", lambda t: t.select(list(reversed(t.column_names))), None, None),
    "token as plain text": (
        "tokens",
        lambda t: t.set_column(t.schema.get_field_index("token"), "token", pa.array(["a", "b"])),
        None,
        None,
    ),
    "rule column dropped": (
        "tokens",
        lambda t: t.drop_columns(["blocked_ppo"]),
        "blocked_ppo",
        r"missing, read as null: blocked_ppo\)",
    ),
    "samples reward widened": (
        "samples",
        lambda t: t.set_column(t.schema.get_field_index("reward"), "reward", pc.cast(t["reward"], pa.float64())),
        None,
        r"cast to the run's type: reward \(Float64 to Float32\)\)",
    ),
    "samples column dropped": (
        "samples",
        lambda t: t.drop_columns(["reward"]),
        "reward",
        r"missing, read as null: reward\)",
    ),
    "metrics value narrowed": (
        "metrics",
        lambda t: t.set_column(t.schema.get_field_index("value"), "value", pc.cast(t["value"], pa.float32())),
        None,
        r"cast to the run's type: value \(Float32 to Float64\)\)",
    ),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_part_of_another_schema_is_read_with_what_it_has(tmp_path, change):
    """Read conformed to the run's columns, with a warning naming the file and every column that
    differs; a change that loses nothing (columns reordered, text not dictionary-encoded) is silent."""
    path = _two_part_run(tmp_path)
    table, edit, null_column, says = CHANGES[change]
    expected = getattr(load_run(path), table).collect()
    part = _edit(path, table, 1, edit)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = getattr(load_run(path), table).collect()
    messages = [str(w.message) for w in caught if issubclass(w.category, RunWarning)]
    if says is None:
        assert messages == []
    else:
        assert len(messages) == 1 and str(part) in messages[0], messages
        assert re.search(says, messages[0]), messages[0]
    assert got.schema == expected.schema and got.height == expected.height
    rank1 = pl.col("rank") == 1
    for column in expected.columns:
        if column == null_column:
            assert got.filter(rank1)[column].null_count() == got.filter(rank1).height > 0
        elif column != "token":
            assert got[column].to_list() == expected[column].to_list(), column


SKIPS = {  # name -> (table, change, what the warning says)
    "key column dropped": ("tokens", lambda t: t.drop_columns(["step"]), "no column step"),
    "update dropped": ("tokens", lambda t: t.drop_columns(["update"]), "no column update"),
    "text for a number": (
        "tokens",
        lambda t: t.set_column(t.schema.get_field_index("pi_logp"), "pi_logp", pa.array(["x", "y"])),
        "pi_logp",
    ),
    "metrics name dropped": ("metrics", lambda t: t.drop_columns(["name"]), "no column name"),
}


@pytest.mark.parametrize("change", list(SKIPS))
def test_a_part_that_cannot_be_conformed_is_skipped_naming_the_file(tmp_path, change):
    path = _two_part_run(tmp_path)
    table, edit, says = SKIPS[change]
    part = _edit(path, table, 1, edit)
    with pytest.warns(RunWarning, match=says) as caught:
        rows = getattr(load_run(path), table).collect()
    assert str(part) in str(caught[0].message)
    assert rows["rank"].to_list() == [0] * rows.height and rows.height >= 1  # rank 0's rows still read


def test_every_part_skipped_gives_empty_rows(tmp_path):
    path = _two_part_run(tmp_path)
    for rank in (0, 1):
        _edit(path, "samples", rank, lambda t: t.drop_columns(["step"]))
    with pytest.warns(RunWarning, match="no column step"):
        samples = load_run(path).samples.collect()
    assert samples.height == 0 and "reward" in samples.columns


def test_valid_reading_edge_cases(tmp_path):
    path = _two_part_run(tmp_path)
    run = load_run(path)
    assert run.tokens.filter(pl.col("step") > 99).collect().height == 0  # an empty filter: no rows, no error
    assert run.metrics.filter(pl.col("name") == "nope").collect()["value"].to_list() == []
    no_mu = write_run(
        tmp_path / "no_mu",
        tokens={"step": [0], "sample": [0], "pos": [0], "pi_logp": [float("-inf")], "old_logp": [-1.0]},
    )
    tokens = load_run(no_mu).tokens.collect()
    assert tokens["mu_logp"].to_list() == [None] and tokens["pi_logp"].to_list() == [float("-inf")]


def test_run_json_rules_not_a_mapping_loads_the_parts_with_a_warning(tmp_path):
    import json

    from trustlens.synthetic import write_synthetic_run

    path = write_synthetic_run(tmp_path / "r", steps=2, samples_per_step=8, seq_len=4, group_size=4)
    rows = load_run(path).tokens.collect().height
    manifest = json.loads((tmp_path / "r" / "run.json").read_text())
    (tmp_path / "r" / "run.json").write_text(json.dumps({**manifest, "rules": "ppo"}))
    with pytest.warns(RunWarning, match="rules 'ppo': not a mapping"):
        assert load_run(path).tokens.collect().height == rows


@pytest.mark.parametrize("verify", ["no", 0, None])
def test_verify_must_be_a_bool(tmp_path, verify):
    with pytest.raises(TypeError, match=r"^verify must be True or False"):
        load_run(tmp_path, verify=verify)
    with pytest.raises(TypeError, match=r"^verify must be True or False"):
        load_runs(tmp_path, verify=verify)


@pytest.mark.parametrize(
    ("key", "lost"),
    [
        ("rules", "taken from the blocked_<rule> columns"),
        ("active_rule", "which rule the run trained with"),
        ("anchor", "what π was compared with"),
        ("status", "status unknown"),
        ("world_size", "how many ranks recorded it"),
    ],
)
def test_a_run_json_without_a_needed_key_warns_what_is_lost(tmp_path, key, lost):
    import json

    path = _two_part_run(tmp_path)
    manifest = json.loads((path / "run.json").read_text())
    del manifest[key]
    (path / "run.json").write_text(json.dumps(manifest))
    with pytest.warns(RunWarning, match=f"run.json has no {key}; read without it .*{re.escape(lost)}"):
        run = load_run(path)
    assert run.tokens.collect().height == 4
    if key == "rules":  # the rule columns still read, as the stand-in rules say
        assert list(run.rules) == ["ppo"] and run.tokens.collect()["blocked_ppo"].to_list() == [False, True] * 2
    if key == "status":
        assert run.status == "unknown"


def _stamp(part, world_size):
    table = pq.read_table(part)
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"trustlens.world_size": world_size}), part)


def test_ranks_written_with_different_world_sizes_are_refused_naming_both(tmp_path):
    from trustlens.run import NotARunError

    path = _two_part_run(tmp_path)
    part = next((path / "tokens" / "rank=1").glob("part-*.parquet"))
    _stamp(part, b"4")
    says = r"different world sizes: world_size 2 \(.*run.json\) and world_size 4"
    with pytest.raises(NotARunError, match=says) as err:
        load_run(path)
    assert str(part) in str(err.value)
    with pytest.warns(RunWarning, match="different world sizes"):  # a folder of runs skips it, saying why
        assert load_runs(tmp_path) == []


def test_resuming_with_another_world_size_is_refused_naming_both(tmp_path):
    from trustlens.record import TokenRecorder

    with TokenRecorder(tmp_path / "run", rank=1, world_size=2):
        pass
    with TokenRecorder(tmp_path / "run", rank=0, world_size=2) as rec:
        rec.log_metrics(0, {"a": 1.0})
    with pytest.raises(ValueError, match=r"world_size 3 differs from the world size the run .* recorded with \(2\)"):
        TokenRecorder(tmp_path / "run", rank=0, world_size=3, resume=True)
    with pytest.raises(ValueError, match=r"world_size 1 differs .* \(2\)"):
        TokenRecorder(tmp_path / "run", rank=0, world_size=1, resume=True)
    TokenRecorder(tmp_path / "run", rank=0, world_size=2, resume=True).close()  # the same: resumed
