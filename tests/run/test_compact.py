"""trustlens.run.compact: a sampled run's part files are merged when its writer closes; every
reader (load_run, RunFollower, a resuming writer) sees each row once, also after a writer killed
between writing the merged part and deleting the parts it replaces."""

import json

import polars as pl
import pyarrow.parquet as pq
import pytest
import torch
from test_follow import _tokens

from trustlens import Keep, TokenRecorder, load_run
from trustlens.run import compact
from trustlens.run.follow import RunFollower
from trustlens.run.manifest import new_manifest
from trustlens.run.schema import META_REPLACES
from trustlens.run.tables import rule_entries
from trustlens.run.writer import RankWriter

KEYS = ["step", "update", "sample", "pos"]


def feed(rec, steps, flush: bool, first: int = 0) -> None:
    """The same rows whatever the recorder: `steps` steps of 2 updates; `flush`: a part file per update."""
    g = torch.Generator().manual_seed(first)
    for step in range(first, first + steps):
        for update in range(2):
            mu = -torch.rand(8, 12, generator=g) * 3
            rec.record(
                step,
                update=update,
                token_ids=torch.randint(0, 50, (8, 12), generator=g),
                response_mask=torch.arange(12)[None, :] < torch.randint(4, 13, (8, 1), generator=g),
                pi_logp=(mu + 0.2 * torch.randn(8, 12, generator=g)).clamp(max=0),
                mu_logp=mu,
                old_logp=(mu + 0.05 * torch.randn(8, 12, generator=g)).clamp(max=0),
                advantages=torch.randn(8, generator=g).sign(),
            )
            if flush:
                rec.flush()


def parts(run_dir, table):
    return sorted(p.name for p in (run_dir / table / "rank=0").glob("*.parquet"))


def sampled(path, flush, steps=3):
    with TokenRecorder(path, rules=["ppo", "rs_geo"], active_rule="ppo", keep=Keep(rate=0.2, seed=1)) as rec:
        feed(rec, steps, flush)
    return load_run(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compact")
    return {"flushed": sampled(root / "flushed", flush=True), "once": sampled(root / "once", flush=False)}


def test_a_sampled_run_closes_with_one_part_per_table(runs):
    path = runs["flushed"].path
    assert parts(path, "tokens") == ["part-000006.parquet"]  # parts 0-5, one per update, then the merged one
    assert parts(path, "aggregates") == ["part-000006.parquet"]
    replaces = json.loads(pq.read_metadata(path / "tokens/rank=0/part-000006.parquet").metadata[META_REPLACES])
    assert [i for i, _ in replaces] == [0, 1, 2, 3, 4, 5]
    assert sum(n for _, n in replaces) == runs["flushed"].tokens.select(pl.len()).collect().item()


def test_the_merged_run_reads_as_one_written_at_once(runs):
    for table in ("tokens", "aggregates", "metrics"):
        got = getattr(runs["flushed"], table).collect()
        want = getattr(runs["once"], table).collect()
        if table == "tokens":
            got, want = got.sort(KEYS), want.sort(KEYS)
        assert got.equals(want), table
    assert runs["flushed"].tokens.select(pl.len()).collect().item() > 0


def test_a_full_run_keeps_its_parts(tmp_path):
    with TokenRecorder(tmp_path / "full", rules=["ppo"], active_rule="ppo") as rec:
        feed(rec, 2, flush=True)
    assert parts(tmp_path / "full", "tokens") == [f"part-00000{i}.parquet" for i in range(4)]


def test_groups_stay_within_compact_bytes(tmp_path, monkeypatch, runs):
    monkeypatch.setattr(compact, "_size", lambda path: 1)  # every part 1 byte, two to a group
    monkeypatch.setattr(compact, "COMPACT_BYTES", 2)
    run = sampled(tmp_path / "run", flush=True)
    assert parts(run.path, "tokens") == ["part-000006.parquet", "part-000007.parquet", "part-000008.parquet"]
    assert run.tokens.collect().sort(KEYS).equals(runs["once"].tokens.collect().sort(KEYS))


def _writer(path, **kwargs):
    manifest = new_manifest(rules=rule_entries(["ppo"]), active_rule="ppo", config={}, world_size=1)
    return RankWriter(path, rank=0, world_size=1, rules=["ppo"], manifest=manifest, rows_per_file=10**6, **kwargs)


def _write_steps(writer, steps):
    for step in steps:
        writer.append("tokens", _tokens(step))
        writer.write_all()


def test_a_writer_killed_between_merging_and_deleting_loses_and_doubles_nothing(tmp_path, monkeypatch):
    writer = _writer(tmp_path / "run", compact=True)
    _write_steps(writer, range(4))
    monkeypatch.setattr(compact, "_delete", lambda path: None)  # killed before the first delete
    writer.compact_parts()
    writer.end("interrupted")
    assert parts(tmp_path / "run", "tokens") == [f"part-00000{i}.parquet" for i in range(5)]
    assert (
        load_run(tmp_path / "run").tokens.select("step").collect()["step"].to_list()
        == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    )
    follower = RunFollower(tmp_path / "run")
    steps = follower.poll().steps
    assert [(s.step, s.tokens.height) for s in steps] == [(s, 3) for s in range(4)]
    monkeypatch.undo()
    _writer(tmp_path / "run", resume=True).close()  # the next writer of the rank deletes them
    assert parts(tmp_path / "run", "tokens") == ["part-000004.parquet"]
    assert load_run(tmp_path / "run").tokens.select(pl.len()).collect().item() == 12


def test_a_follower_reads_each_row_once_across_the_merge(tmp_path):
    writer = _writer(tmp_path / "run", compact=True)
    follower = RunFollower(tmp_path / "run")
    _write_steps(writer, range(3))
    seen = follower.poll().steps  # parts 0-2 read: steps 0 and 1 complete
    _write_steps(writer, range(3, 5))
    writer.compact_parts()  # parts 3 and 4 deleted before the follower read them
    writer.end("finished")
    seen += follower.poll().steps
    assert [(s.step, s.tokens.height) for s in seen] == [(s, 3) for s in range(5)]
    assert follower.state.late_rows == 0 and follower.done


def test_a_fresh_follower_of_a_resumed_merged_run_reads_it_while_written(tmp_path):
    writer = _writer(tmp_path / "run", compact=True)
    _write_steps(writer, range(3))
    writer.close()
    writer = _writer(tmp_path / "run", resume=True, compact=True)
    _write_steps(writer, range(3, 5))
    follower = RunFollower(tmp_path / "run")  # the run says running; its parts start at 3
    follower.poll()  # the steps below the last one read are complete at the next poll
    assert [s.step for s in follower.poll().steps] == [0, 1, 2, 3]
    writer.close()
    assert [s.step for s in follower.poll().steps] == [4]
    assert parts(tmp_path / "run", "tokens") == ["part-000006.parquet"]
    assert load_run(tmp_path / "run").tokens.select(pl.len()).collect().item() == 15


def test_a_sampled_run_with_live_alerts_keeps_them_through_the_merge(tmp_path, monkeypatch):
    """alerts=True writes each step at its end and an alert at once: many small parts of every
    table; merged, every table reads as before the merge."""

    def recorded(path):
        g = torch.Generator().manual_seed(0)
        with TokenRecorder(path, rules=["ppo"], alerts=True, keep=Keep(rate=0.5)) as rec:
            for step in range(36):  # entropy 1 → 0.2 at step 25, reward 1 → 0 at step 30
                mu = -torch.rand(8, 6, generator=g) - 0.1
                rec.record(
                    step,
                    token_ids=torch.randint(0, 9, (8, 6), generator=g),
                    response_mask=torch.ones(8, 6),
                    pi_logp=mu,
                    mu_logp=mu,
                    advantages=torch.randn(8, generator=g),
                    entropy=torch.full((8, 6), 1.0 if step < 25 else 0.2),
                )
                rec.log_samples(step, rewards=[1.0 if step < 30 else 0.0] * 8)
                rec.end_step(step)
        return load_run(path)

    merged = recorded(tmp_path / "merged")
    monkeypatch.setattr(RankWriter, "compact_parts", lambda self: None)
    apart = recorded(tmp_path / "apart")
    assert len(parts(apart.path, "alerts")) > 1 and len(parts(apart.path, "tokens")) == 36
    # the alerts keep their parts: an alert's later rows keep its first step, so the rows of the
    # parts in part order are not in step order (as each part file's rows are)
    assert parts(merged.path, "alerts") == parts(apart.path, "alerts")
    for table in ("tokens", "samples", "aggregates", "alerts"):
        assert len(parts(merged.path, table)) == 1 or table == "alerts", table
        got, want = getattr(merged, table).collect(), getattr(apart, table).collect()
        if table == "alerts":  # when each was raised
            got, want = got.drop("raised_wall_time"), want.drop("raised_wall_time")
        assert got.height > 0 and got.equals(want), table
