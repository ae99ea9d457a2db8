"""The one writer: exclusive ranks, resume/overwrite, failures, timeouts (trustlens.run.writer)."""

import errno
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading

import polars as pl
import pyarrow.parquet as pq
import pytest
import torch

from trustlens import TokenRecorder, load_run
from trustlens.run import RunLockedError, WriterError
from trustlens.run import parts as parts_module
from trustlens.run import writer as writer_module
from trustlens.run.parts import PartFiles

B, T = 2, 4


def batch(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    mu = -torch.rand(B, T, generator=g) - 0.1
    return {
        "token_ids": torch.randint(0, 9, (B, T), generator=g),
        "response_mask": torch.ones(B, T),
        "pi_logp": mu * 0.9,
        "mu_logp": mu,
        "advantages": torch.tensor([1.0, -1.0]),
    }


def manifest_of(path) -> dict:
    return json.loads((path / "run.json").read_text())


def rows(path) -> pl.DataFrame:
    return load_run(path).tokens.collect().sort("rank", "step", "sample", "pos")


def test_second_writer_of_a_rank_fails_at_open_naming_dir_and_holder(tmp_path):
    path = tmp_path / "run"
    with TokenRecorder(path, rules=["ppo"]) as first:
        first.record(0, **batch())
        holder = f"pid {os.getpid()} on host {socket.gethostname()}"
        with pytest.raises(RunLockedError, match=f"run_dir '{path}' rank 0 is being written by {holder}"):
            TokenRecorder(path, rules=["ppo"])
        with pytest.raises(RunLockedError):
            TokenRecorder(path, rules=["ppo"], overwrite=True)  # not even to replace it
        first.record(1, **batch())
    assert manifest_of(path)["status"] == "finished"
    assert sorted(set(rows(path)["step"])) == [0, 1] and rows(path).height == 2 * B * T  # nothing lost


HOLDER = textwrap.dedent(
    """
    import sys, torch
    from trustlens import TokenRecorder
    rec = TokenRecorder(sys.argv[1], rules=["ppo"])
    mu = -torch.rand(2, 4) - 0.1
    rec.record(0, token_ids=torch.zeros(2, 4, dtype=torch.long), response_mask=torch.ones(2, 4), pi_logp=mu,
               mu_logp=mu, advantages=torch.ones(2))
    rec.flush()
    print("open", flush=True)
    sys.stdin.readline()
    """
)


def test_another_process_holds_the_rank_until_it_dies(tmp_path):
    path = tmp_path / "run"
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline() == "open\n"
        with pytest.raises(RunLockedError, match=f"being written by pid {child.pid} on host "):
            TokenRecorder(path, rules=["ppo"], resume=True)
        child.kill()  # SIGKILL: the kernel releases the lock
        child.wait(timeout=30)
    finally:
        child.kill()
    with TokenRecorder(path, rules=["ppo"], resume=True) as rec:
        rec.record(1, **batch())
    assert sorted(set(rows(path)["step"])) == [0, 1]


def test_ranks_0_and_1_open_in_one_process(tmp_path):
    path = tmp_path / "run"
    with (
        TokenRecorder(path, rules=["ppo"], rank=0, world_size=2) as r0,
        TokenRecorder(path, rules=["ppo"], rank=1, world_size=2) as r1,
    ):
        r0.record(0, **batch(0))
        r1.record(0, **batch(1))
        r1.log_metrics(0, {"loss": 1.0})
    df = rows(path)
    assert df.group_by("rank").len().sort("rank").rows() == [(0, B * T), (1, B * T)]
    assert df.select("sample").n_unique() == 2 * B
    assert load_run(path).metrics.collect()["rank"].to_list() == [1]
    assert manifest_of(path)["world_size"] == 2


def test_a_finished_run_is_only_reopened_by_resume_or_overwrite(tmp_path):
    path = tmp_path / "run"
    with TokenRecorder(path, rules=["ppo"]) as rec:
        for step in range(3):
            rec.record(step, **batch(step))
    run_id = manifest_of(path)["run_id"]
    assert len(run_id) == 32
    with pytest.raises(FileExistsError, match=r"already holds a run .*resume=True.*overwrite=True"):
        TokenRecorder(path, rules=["ppo"])
    with pytest.raises(ValueError, match="resume and overwrite are exclusive"):
        TokenRecorder(path, rules=["ppo"], resume=True, overwrite=True)

    with TokenRecorder(path, rules=["ppo"], resume=True) as rec:
        assert rec.run_id == run_id and manifest_of(path)["status"] == "running"
        for old in (0, 2):
            with pytest.raises(ValueError, match=f"step {old} was recorded before: this run was resumed after step 2"):
                rec.record(old, **batch())
        with pytest.raises(ValueError, match="step 1 was recorded before"):
            rec.log_metrics(1, {"x": 1.0})
        rec.record(3, **batch(3))
    manifest = manifest_of(path)
    assert manifest["run_id"] == run_id and manifest["status"] == "finished" and len(manifest["resumed"]) == 1
    assert manifest["resumed_after"] == [2]  # the resume point: the doctor's resume check reads it
    assert sorted(set(rows(path)["step"])) == [0, 1, 2, 3]
    names = sorted(p.name for p in (path / "tokens" / "rank=0").iterdir())
    assert names == ["part-000000.parquet", "part-000001.parquet"]  # numbering continues

    with TokenRecorder(path, rules=["ppo"], overwrite=True) as rec:
        rec.record(0, **batch(9))
    assert manifest_of(path)["run_id"] != run_id and manifest_of(path)["resumed"] == []
    assert rows(path)["step"].to_list() == [0] * (B * T)


def test_resume_on_an_empty_directory_starts_a_run(tmp_path):
    with TokenRecorder(tmp_path / "run", rules=["ppo"], resume=True) as rec:
        rec.record(0, **batch())
    assert manifest_of(tmp_path / "run")["status"] == "finished"


def _write_that_fills_the_disk(table, where, **options):
    where.write(b"PAR1 partial")  # some bytes reach the temporary file
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_full_disk_fails_the_run_with_the_cause_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "run"
    rec = TokenRecorder(path, rules=["ppo"], rows_per_file=B * T)
    rec.record(0, **batch())
    rec.flush()
    monkeypatch.setattr(parts_module.pq, "write_table", _write_that_fills_the_disk)
    rec.record(1, **batch())  # fills a part file: the write fails in the writer thread
    with pytest.raises(WriterError, match="No space left on device") as caught:
        for step in range(2, 100):  # the next call raises, with the cause
            rec.record(step, **batch())
            rec.flush()
    assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == errno.ENOSPC
    with pytest.raises(WriterError):
        rec.close()
    manifest = manifest_of(path)
    assert manifest["status"] == "failed" and "No space left on device" in manifest["error"]
    assert not list(path.rglob("*.tmp"))
    monkeypatch.undo()
    assert rows(path)["step"].to_list() == [0] * (B * T)  # what was written before still loads


def test_a_tokenizer_that_raises_fails_the_run(tmp_path):
    class Broken:
        def decode(self, ids):
            raise RuntimeError("no such token")

    rec = TokenRecorder(tmp_path / "run", rules=["ppo"], tokenizer=Broken())
    rec.record(0, **batch())
    with pytest.raises(WriterError, match="no such token"):
        rec.close()
    assert "RuntimeError: no such token" in manifest_of(tmp_path / "run")["error"]


def test_a_stuck_writer_raises_after_writer_timeout(tmp_path, monkeypatch):
    release = threading.Event()
    real_write = PartFiles.write

    def stuck(self, decoder):
        release.wait()
        return real_write(self, decoder)

    monkeypatch.setattr(PartFiles, "write", stuck)
    rec = TokenRecorder(tmp_path / "run", rules=["ppo"], rows_per_file=1, queue_size=1, writer_timeout=0.3)
    with pytest.raises(WriterError, match=r"did not .* within writer_timeout=0.3 s"):
        for step in range(10):  # the thread hangs on the first part file; the queue fills
            rec.record(step, **batch())
    with pytest.raises(WriterError, match="within writer_timeout"):
        rec.close()
    release.set()
    rec._writer._thread.join(10)
    assert manifest_of(tmp_path / "run")["status"] == "failed"


@pytest.mark.parametrize("name", ["flush_seconds", "writer_timeout"])
@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), "5", True])
def test_seconds_are_validated(tmp_path, name, value):
    with pytest.raises(ValueError, match=f"{name} must be a finite number of seconds > 0"):
        TokenRecorder(tmp_path / "run", **{name: value})
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", [0, "8", 2.0, True])
def test_queue_size_is_validated(tmp_path, value):
    with pytest.raises(ValueError, match=r"queue_size must be an integer in \[1, 2147483648\)"):
        TokenRecorder(tmp_path / "run", queue_size=value)
    assert not (tmp_path / "run").exists()


def test_part_files_carry_page_checksums(tmp_path):
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        rec.record(0, **batch())
    part = tmp_path / "run" / "tokens" / "rank=0" / "part-000000.parquet"
    pq.ParquetFile(part, page_checksum_verification=True).read()  # reads
    assert "rank" not in pq.read_schema(part).names


def test_a_buffer_of_long_sample_texts_is_written_once_it_holds_part_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "PART_BYTES", 10_000)
    long = "x" * 4000  # three samples' texts pass 10,000 bytes
    with TokenRecorder(tmp_path / "run", rules=["ppo"], rows_per_file=10**6, flush_seconds=1000) as rec:
        for step in range(4):
            rec.log_samples(step, prompts=["p", "q"], responses=[long, long], rewards=[1.0, 0.0])
        rec.flush()
        parts = sorted((tmp_path / "run" / "samples" / "rank=0").glob("part-*.parquet"))
        assert [pq.read_metadata(p).num_rows for p in parts] == [4, 4]  # written at 2 steps' 16 kB
    samples = load_run(tmp_path / "run").samples.collect()
    assert samples.height == 8 and samples["response"].str.len_chars().min() == 4000


def test_token_decoder_decodes_each_id_once_in_dictionary_order():
    import pyarrow as pa

    class Counting:
        def __init__(self):
            self.calls = []

        def decode(self, ids):
            self.calls.extend(ids)
            return f"<{ids[0]}>"

    tok = Counting()
    decoder = parts_module.TokenDecoder(tok)
    first = decoder.dictionary_column(pa.chunked_array([[7, 3, 7], [2**31 - 1, 3]], pa.int32()))
    assert first.to_pylist() == ["<7>", "<3>", "<7>", f"<{2**31 - 1}>", "<3>"]
    assert first.chunk(0).dictionary.to_pylist() == ["<7>", "<3>", f"<{2**31 - 1}>"]  # one per distinct id
    second = decoder.dictionary_column(pa.chunked_array([[3, 0, 2**31 - 1, 5]], pa.int32()))
    assert second.to_pylist() == ["<3>", "<0>", f"<{2**31 - 1}>", "<5>"]
    assert sorted(tok.calls) == [0, 3, 5, 7, 2**31 - 1]  # each id decoded once over both parts
    assert decoder.dictionary_column(pa.chunked_array([], pa.int32())).to_pylist() == []
