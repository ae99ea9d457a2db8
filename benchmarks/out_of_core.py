"""The analyses on a run too large to hold in memory: time and peak memory of each, every query in
a fresh process, against a baseline process that only imports trustlens and loads the run.

    python benchmarks/synthetic_run.py --out RUN --tokens 1e9 --keep-rate 0.01 \\
        --samples-per-step 4096 --seq-len 1024            # the sampled 10⁹-token run (~25 min)
    python benchmarks/out_of_core.py RUN

Prints the run's size (tokens trained, token rows kept, bytes on disk, and what its token table
would take in memory if collected, from polars' estimate on one part file scaled by the rows),
then per query: seconds, peak resident memory (ru_maxrss of its process), and the peak over the
baseline process's. The per-step queries take the run's exact aggregates (as the dashboard's
overview and the report do); the token-level ones scan the kept rows with polars' streaming
engine. Dashboard page times on the same run: `python benchmarks/dashboard.py --run RUN`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from trustlens import analysis
from trustlens.run import load_run


def _queries(run) -> dict:
    tokens, aggregates = run.tokens, analysis.exact_aggregates(run)
    return {
        "load_run (baseline)": lambda: None,
        "step_summary (aggregates)": lambda: analysis.step_summary(tokens, aggregates=aggregates),
        "blocked_per_step (aggregates)": lambda: analysis.blocked_per_step(tokens, aggregates=aggregates),
        "mismatch_per_step (aggregates)": lambda: analysis.mismatch_per_step(tokens, aggregates=aggregates),
        "step_signals": lambda: analysis.step_signals(run),
        "blocked_by_bucket": lambda: analysis.blocked_by_bucket(tokens),
        "blocked_by_token": lambda: analysis.blocked_by_token(tokens),
        "rule_confusion (ppo, dppo_binary_tv)": lambda: analysis.rule_confusion(tokens, "ppo", "dppo_binary_tv"),
        "mismatch_by_bucket": lambda: analysis.mismatch_by_bucket(tokens),
        "figure1_density (ratio)": lambda: analysis.figure1_density(tokens, y="ratio", rules=("ppo", "dppo_binary_tv")),
    }


def _one(run_dir: str, name: str) -> None:
    """Run one query in this process; print its seconds and peak RSS as JSON."""
    run = load_run(run_dir, verify=False)
    query = _queries(run)[name]
    start = time.perf_counter()
    query()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_mb": peak}))


def _size(run_dir: Path) -> None:
    run = load_run(run_dir, verify=False)
    parts = run.files["tokens"]
    rows = sum(pq.read_metadata(p).num_rows for p in parts)
    trained = run.aggregates.select(pl.col("tokens").sum()).collect().item() if run.sampled else rows
    first = pl.read_parquet(parts[0])
    in_memory = first.estimated_size() / first.height * rows
    disk = sum(f.stat().st_size for f in run_dir.rglob("*.parquet"))
    print(f"run:            {run_dir}")
    print(f"tokens trained: {trained:,}" + (" (sampled run: exact aggregates of all)" if run.sampled else ""))
    print(f"token rows:     {rows:,} in {len(parts)} part files")
    print(f"on disk:        {disk / 2**30:.2f} GiB (every table)")
    print(f"token table in memory, if collected: ~{in_memory / 2**30:.1f} GiB (polars' estimate, scaled)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a recorded run (benchmarks/synthetic_run.py writes one)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one query in this process
    args = parser.parse_args(argv)
    if args.one:
        _one(str(args.run), args.one)
        return 0
    _size(args.run)
    baseline = None
    print(f"{'query':40s} {'seconds':>9s} {'peak RSS MB':>12s} {'over baseline':>14s}")
    for name in _queries(load_run(args.run, verify=False)):
        done = subprocess.run(
            [sys.executable, __file__, str(args.run), "--one", name], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            print(f"{name:40s} failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        baseline = result["peak_mb"] if baseline is None else baseline
        print(
            f"{name:40s} {result['seconds']:9.2f} {result['peak_mb']:12.0f} {result['peak_mb'] - baseline:+14.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
