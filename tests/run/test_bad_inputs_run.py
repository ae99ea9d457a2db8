"""Bad inputs to reading runs: paths that are not runs, and part files whose schema differs from
the run's (issue 32): the run still loads, the part read with what it has or skipped with a
warning naming the file."""

from __future__ import annotations

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
    with pytest.raises(NotARunError, match="no such directory"):
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


CHANGES = {  # name -> (table, change, the column that comes back null on rank 1, or None)
    "column dropped": ("tokens", lambda t: t.drop_columns(["pi_logp"]), "pi_logp"),
    "column added": ("tokens", lambda t: t.append_column("extra", pa.array([1, 2])), None),
    "column renamed": (
        "tokens",
        lambda t: t.rename_columns(["mu_logp2" if n == "mu_logp" else n for n in t.column_names]),
        "mu_logp",
    ),
    "float widened": (
        "tokens",
        lambda t: t.set_column(t.schema.get_field_index("pi_logp"), "pi_logp", pc.cast(t["pi_logp"], pa.float64())),
        None,
    ),
    "int widened": (
        "tokens",
        lambda t: t.set_column(t.schema.get_field_index("pos"), "pos", pc.cast(t["pos"], pa.int64())),
        None,
    ),
    "columns reordered": ("tokens", lambda t: t.select(list(reversed(t.column_names))), None),
    "token as plain text": (
        "tokens",
        lambda t: t.set_column(t.schema.get_field_index("token"), "token", pa.array(["a", "b"])),
        None,
    ),
    "rule column dropped": ("tokens", lambda t: t.drop_columns(["blocked_ppo"]), "blocked_ppo"),
    "samples reward widened": (
        "samples",
        lambda t: t.set_column(t.schema.get_field_index("reward"), "reward", pc.cast(t["reward"], pa.float64())),
        None,
    ),
    "samples column dropped": ("samples", lambda t: t.drop_columns(["reward"]), "reward"),
    "metrics value narrowed": (
        "metrics",
        lambda t: t.set_column(t.schema.get_field_index("value"), "value", pc.cast(t["value"], pa.float32())),
        None,
    ),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_part_of_another_schema_is_read_with_what_it_has(tmp_path, change):
    path = _two_part_run(tmp_path)
    table, edit, null_column = CHANGES[change]
    expected = getattr(load_run(path), table).collect()
    _edit(path, table, 1, edit)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read, not skipped: no warning
        got = getattr(load_run(path), table).collect()
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
