"""The example scripts run end to end on a tiny budget, and README shows their real code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import polars as pl

from trustlens import load_run

ROOT = Path(__file__).resolve().parent.parent
PLAIN_LOOP = ROOT / "examples" / "plain_loop.py"
MARK = "# trustlens"


def run_script(script: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_plain_loop_records_a_run(tmp_path):
    out = tmp_path / "plain"
    run_script(
        PLAIN_LOOP,
        "--out",
        str(out),
        "--steps",
        "2",
        "--prompts",
        "2",
        "--group",
        "3",
        "--updates",
        "2",
        "--max-new",
        "5",
    )
    run = load_run(out)
    assert run.manifest["status"] == "finished"
    assert run.manifest["anchor"] == "mu" and run.manifest["missing"] == []
    assert run.manifest["active_rule"] == "ppo" and run.manifest["config"]["steps"] == 2
    tokens = run.tokens.collect()
    samples = run.samples.collect()
    assert samples.height == 2 * 6 and samples["sample"].n_unique() == 12
    assert samples["group"].to_list() == [s // 3 for s in range(6)] * 2
    # every update records every response token once: rows = updates × the samples' lengths
    assert tokens.select("step", "update").unique().height == 4
    assert tokens.select("step", "update", "sample", "pos").is_duplicated().sum() == 0
    per_sample = tokens.filter(pl.col("update") == 1).group_by("step", "sample").agg(pl.len().alias("n"))
    joined = per_sample.join(samples, on=["step", "sample"], how="full", coalesce=True)
    assert joined.height == 12 and (joined["n"] == joined["length"]).all()
    # everything the loop hands over is filled; update 0 sees π = π_old, update 1 has moved
    filled = ["mu_logp", "old_logp", "pi_logp", "ratio", "binary_tv", "topk_tv", "topk_kl", "entropy"]
    assert tokens.select(pl.col(filled).null_count()).sum_horizontal().item() == 0
    moved = tokens.group_by("update").agg((pl.col("pi_logp") - pl.col("old_logp")).abs().max().alias("d"))
    moved = dict(moved.iter_rows())
    assert moved[0] < 1e-5 < moved[1]
    assert set(run.metrics.collect()["name"]) == {"reward/mean", "loss"}


def trustlens_lines(path: Path) -> list[str]:
    """The lines of `path` marked as trustlens code, without the marker."""
    text = path.read_text()
    return [line.split(MARK)[0].strip() for line in text.splitlines() if line.rstrip().endswith(MARK)]


def test_plain_loop_attaches_in_under_15_lines():
    assert 0 < len(trustlens_lines(PLAIN_LOOP)) < 15


def test_readme_snippet_is_the_example_code():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Attach to your training loop", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script = {line.split(MARK)[0].strip() for line in PLAIN_LOOP.read_text().splitlines()}
    code = [line.strip() for line in snippet.splitlines() if line.strip() and not line.strip().startswith("...")]
    missing = [line for line in code if line not in script]
    assert not missing, f"README lines not in {PLAIN_LOOP.name}: {missing}"
    # and every trustlens line of the example is in the README
    assert set(trustlens_lines(PLAIN_LOOP)) <= set(code)
