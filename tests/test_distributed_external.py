"""An external data-parallel loop under torchrun (2 processes, gloo): each rank records its own
shard of one run directory, and `load_run` reads them as one table with no duplicated rows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from trustlens import load_run

ROOT = Path(__file__).resolve().parent.parent
STEPS, PROMPTS, GROUP, UPDATES = 2, 2, 2, 2


def test_torchrun_ranks_record_one_run(tmp_path):
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(ROOT / "examples" / "plain_loop.py"), "--out", str(out), "--steps", str(STEPS),
        "--prompts", str(PROMPTS), "--group", str(GROUP), "--updates", str(UPDATES), "--max-new", "4",
    ]
    # its own session, so that a hung run is killed with its workers
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]

    run = load_run(out)
    assert run.manifest["status"] == "finished" and run.manifest["world_size"] == 2
    for table in ("tokens", "samples", "metrics"):
        assert sorted(p.name for p in (out / table).iterdir()) == ["rank=0", "rank=1"]

    tokens = run.tokens.collect()
    # one table holding exactly the rows of both shards' part files
    on_disk = sum(pq.ParquetFile(p).metadata.num_rows for p in (out / "tokens").glob("rank=*/*.parquet"))
    assert tokens.height == on_disk
    assert sorted(tokens["rank"].unique()) == [0, 1]
    assert tokens.select("step", "update", "sample", "pos").is_duplicated().sum() == 0
    ids = {r: set(tokens.filter(pl.col("rank") == r)["sample"]) for r in (0, 1)}
    assert ids[0] and ids[1] and not ids[0] & ids[1]

    # each rank logged its own samples, and its token rows are those samples' lengths × updates
    samples = run.samples.collect()
    assert samples.group_by("rank").len().sort("rank")["len"].to_list() == [STEPS * PROMPTS * GROUP] * 2
    per_sample = tokens.group_by("rank", "step", "sample").agg(pl.len().alias("n"))
    joined = per_sample.join(samples, on=["rank", "step", "sample"], how="full", coalesce=True)
    assert joined.height == 2 * STEPS * PROMPTS * GROUP
    assert (joined["n"] == UPDATES * joined["length"]).all()
    metrics = run.metrics.collect()
    assert metrics.group_by("rank").len().sort("rank")["len"].to_list() == [2 * STEPS] * 2
