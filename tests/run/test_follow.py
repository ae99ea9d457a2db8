"""trustlens.run.follow: a run followed while it is written returns each step once, complete, with
the rows `load_run` reads, reading each part file once and never one still being written."""

import threading
import time

import polars as pl
import pyarrow as pa
import pytest
from s3_server import BUCKET

from trustlens import load_run
from trustlens.run import CorruptPartWarning, NotARunError
from trustlens.run.follow import RunFollower, updated_seconds_ago, writer_alive
from trustlens.run.manifest import new_manifest
from trustlens.run.tables import rule_entries
from trustlens.run.writer import RankWriter
from trustlens.synthetic import write_synthetic_run


def _writer(path, rank=0, world_size=1):
    manifest = new_manifest(rules=rule_entries(["ppo"]), active_rule="ppo", config={}, world_size=world_size)
    return RankWriter(
        path,
        rank=rank,
        world_size=world_size,
        rules=["ppo"],
        manifest=manifest if rank == 0 else None,
        rows_per_file=10**6,
    )


def _tokens(step, n=3):
    return pa.table(
        {
            "step": pa.array([step] * n, pa.int32()),
            "update": pa.array([0] * n, pa.int16()),
            "sample": pa.array([step] * n, pa.int64()),
            "group": pa.array([step] * n, pa.int64()),
            "pos": pa.array(range(n), pa.int32()),
            "token_id": pa.array([1] * n, pa.int32()),
            "pi_logp": pa.array([-0.5] * n, pa.float32()),
        }
    )


def _metric(step, value):
    return pa.table(
        {"step": pa.array([step], pa.int32()), "name": ["reward/mean"], "value": pa.array([value], pa.float64())}
    )


def _follow_to_end(follower, timeout=60.0):
    steps = []
    deadline = time.monotonic() + timeout
    while not follower.done:
        assert time.monotonic() < deadline, "the run never closed"
        steps.extend(follower.poll().steps)
        time.sleep(0.02)
    return steps


def _sorted(frame):
    return frame.sort(["step", "rank", "sample", "pos"] if "pos" in frame.columns else frame.columns)


def test_a_run_being_written_gives_each_step_once_with_the_rows_load_run_reads(tmp_path):
    path = tmp_path / "run"
    started = threading.Event()

    def write():
        write_synthetic_run(
            path,
            steps=10,
            samples_per_step=8,
            seq_len=8,
            world_size=2,
            rows_per_part=1,  # a part file per table, rank and step
            on_step=lambda step: (started.set(), time.sleep(0.05)),
        )

    writer = threading.Thread(target=write)
    writer.start()
    started.wait(30)
    follower = RunFollower(path)
    steps = _follow_to_end(follower)
    writer.join()
    assert [s.step for s in steps] == list(range(10))
    run = load_run(path)
    for table in ("tokens", "samples", "metrics"):
        followed = pl.concat([getattr(s, table) for s in steps])
        assert _sorted(followed).equals(_sorted(getattr(run, table).collect())), table
    assert follower.state.tokens == run.tokens.select(pl.len()).collect().item()
    assert follower.state.parts_read == sum(len(f) for f in run.files.values())  # each part read once
    assert follower.state.last_step == 9 and follower.state.late_rows == 0


def test_a_step_is_complete_once_every_rank_wrote_a_later_one_at_the_previous_poll(tmp_path):
    path = tmp_path / "run"
    r0, r1 = _writer(path, 0, 2), _writer(path, 1, 2)
    follower = RunFollower(path)
    for step in (0, 1):
        r0.append("tokens", _tokens(step))
        r0.write_all()
    r1.append("tokens", _tokens(0))
    r1.write_all()
    assert follower.poll().steps == [] and follower.poll().steps == []  # rank 1 has not passed step 0
    r1.append("tokens", _tokens(1))
    r1.write_all()
    assert follower.poll().steps == []  # seen now, returned at the next poll
    (step0,) = follower.poll().steps
    assert step0.step == 0 and sorted(step0.tokens["rank"].to_list()) == [0, 0, 0, 1, 1, 1]
    r1.close()
    r0.close()
    (step1,) = follower.poll().steps
    assert step1.step == 1 and follower.done and follower.state.status == "finished"


def test_rows_of_a_step_already_returned_are_counted_late_not_returned_again(tmp_path):
    path = tmp_path / "run"
    w = _writer(path)
    follower = RunFollower(path)
    for step in (0, 1):
        w.append("tokens", _tokens(step))
        w.write_all()
    follower.poll()
    (step0,) = follower.poll().steps
    assert step0.metrics.height == 0
    w.append("metrics", _metric(0, 1.0))  # logged after step 1's tokens were written
    w.append("metrics", _metric(1, 2.0))
    w.close()
    (step1,) = follower.poll().steps
    assert step1.step == 1 and step1.metrics["value"].to_list() == [2.0]
    assert follower.state.late_rows == 1


def test_a_part_being_written_is_not_read(tmp_path):
    path = tmp_path / "run"
    w = _writer(path)
    w.append("tokens", _tokens(0))
    w.write_all()
    folder = path / "tokens" / "rank=0"
    (folder / ".part-000001.parquet.tmp").write_bytes(b"PAR1 half a file")
    follower = RunFollower(path)
    follower.poll()
    assert follower.state.parts_read == 1
    w.close()
    assert [s.step for s in follower.poll().steps] == [0]


def test_a_corrupt_part_is_skipped_with_a_warning_and_the_rest_follows(tmp_path):
    path = tmp_path / "run"
    w = _writer(path)
    for step in (0, 1):
        w.append("tokens", _tokens(step))
        w.write_all()
    w.close()
    (path / "tokens" / "rank=0" / "part-000000.parquet").write_bytes(b"not parquet")
    follower = RunFollower(path)
    with pytest.warns(CorruptPartWarning, match="part-000000"):
        steps = follower.poll().steps
    assert [s.step for s in steps] == [1] and follower.done


def test_a_closed_run_is_read_whole_in_one_poll_even_past_a_gap_in_the_part_numbers(tmp_path):
    path = write_synthetic_run(tmp_path / "run", steps=4, samples_per_step=8, seq_len=4, rows_per_part=1)
    (path / "tokens" / "rank=0" / "part-000001.parquet").unlink()  # steps 2, 3 lie past the gap
    follower = RunFollower(path)
    assert [s.step for s in follower.poll().steps] == [0, 1, 2, 3]
    assert follower.done and follower.poll().steps == []


def test_not_a_run_and_the_writer_lock(tmp_path):
    with pytest.raises(NotARunError, match="is not a trustlens run"):
        RunFollower(tmp_path)
    path = tmp_path / "run"
    w = _writer(path)
    assert writer_alive(path) is True
    w.close()
    assert writer_alive(path) is False
    assert writer_alive(tmp_path) is None  # no lock file
    assert updated_seconds_ago({"updated": "2026-01-01T00:00:10+00:00"}, now=1767225620.0) == 10.0
    assert updated_seconds_ago({}) is None


def test_a_run_on_an_object_store_is_followed_part_by_part(s3):
    url = f"s3://{BUCKET}/runs/live"
    w = _writer(url)
    follower = RunFollower(url)
    assert writer_alive(follower.path) is None  # no locks on an object store
    for step in (0, 1, 2):
        w.append("tokens", _tokens(step))
        w.write_all()
    assert follower.poll().steps == []
    assert [s.step for s in follower.poll().steps] == [0, 1]
    w.close()
    assert [s.step for s in follower.poll().steps] == [2] and follower.done
    assert follower.state.parts_read == 3
