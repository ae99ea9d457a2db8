"""External data-parallel runs under torchrun (2 processes, gloo), a plain PyTorch loop and TRL:
each rank records its own shard of one run directory, and `load_run` reads them as one table
with no duplicated rows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from trustlens import load_run

ROOT = Path(__file__).resolve().parent.parent
STEPS, PROMPTS, GROUP, UPDATES = 2, 2, 2, 2


def torchrun(script: str, *args: str) -> None:
    """Run examples/`script` with 2 processes under torchrun; fail with its stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(ROOT / "examples" / script),
        *args,
    ]
    # its own session, so that a hung run is killed with its workers
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, start_new_session=True
    )
    try:
        _, stderr = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]


def test_torchrun_ranks_record_one_run(tmp_path):
    out = tmp_path / "ddp"
    torchrun(
        "plain_loop.py",
        "--out",
        str(out),
        "--steps",
        str(STEPS),
        "--prompts",
        str(PROMPTS),
        "--group",
        str(GROUP),
        "--updates",
        str(UPDATES),
        "--max-new",
        "4",
    )

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


@pytest.mark.slow  # two processes importing TRL: about 50 s on the shared 2-core machine
def test_torchrun_trl_ranks_record_one_run(tmp_path):
    """TRL's GRPOTrainer on 2 processes (accelerate over gloo) with the trustlens hook."""
    out = tmp_path / "trl"
    torchrun("trl_grpo.py", "--out", str(out), "--steps", "3")
    run = load_run(out)
    assert run.manifest["status"] == "finished" and run.manifest["world_size"] == 2
    assert run.manifest["anchor"] == "mu"
    tokens = run.tokens.collect()
    assert sorted(tokens["rank"].unique()) == [0, 1]
    assert tokens.select("step", "update", "sample", "pos").is_duplicated().sum() == 0
    # 2 generations of 16 completions (4 prompts × 4), 8 per rank: ids 0..31, disjoint by rank
    samples = run.samples.collect()
    assert sorted(samples["sample"]) == list(range(32))
    assert samples.group_by("rank", "step").len()["len"].to_list() == [8] * 4
    by_rank = {r: set(samples.filter(pl.col("rank") == r)["sample"]) for r in (0, 1)}
    assert not by_rank[0] & by_rank[1]
    assert set(tokens.filter(pl.col("rank") == 1)["sample"]) <= by_rank[1]
    # a group is one prompt's completions
    assert (samples.group_by("group").agg(pl.col("prompt").n_unique())["prompt"] == 1).all()
    # TRL's logs are already averaged over ranks: only the main process writes them
    assert run.metrics.collect()["rank"].unique().to_list() == [0]
