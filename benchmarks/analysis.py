"""The per-step summary of a large run: trustlens.analysis (lazy polars) against the naive pandas
way (read every part file, concatenate, then group by step), timed in one process.

    python benchmarks/analysis.py [RUN_DIR] [--repeat N]

RUN_DIR defaults to the 10M-token run of benchmarks/synthetic_run.py (written first if missing).
Both sides compute the same table — per step: token count, distinct samples, mean advantage,
mean entropy, mean and max ratio, mean and max binary TV, each rule's blocked fraction — and the
script checks that they agree before printing the times and their ratio (goal: ≥ 5×). It then
times the other queries the dashboard runs on the same run, for reference.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl

from trustlens import analysis
from trustlens.run import load_run

DEFAULT_RUN = Path(__file__).resolve().parent / "out" / "synthetic-10m"


def pandas_summary(run_dir: Path, rules: list[str]) -> pd.DataFrame:
    """The naive way: every token part file into one DataFrame, then a groupby."""
    files = sorted((run_dir / "tokens").glob("rank=*/part-*.parquet"))
    df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    # block rates over A ≠ 0 tokens; the A = 0 share on its own
    nonzero = df["advantage"].isna() | (df["advantage"] != 0)
    for r in rules:
        df[f"blocked_{r}"] = df[f"blocked_{r}"].astype("float64").where(nonzero)
    df["zero_adv"] = (df["advantage"] == 0).astype("float64").where(df["advantage"].notna())
    aggs = {
        "tokens": ("sample", "size"),
        "samples": ("sample", "nunique"),
        "mean_advantage": ("advantage", "mean"),
        "entropy": ("entropy", "mean"),
        "ratio_mean": ("ratio", "mean"),
        "ratio_max": ("ratio", "max"),
        "binary_tv_mean": ("binary_tv", "mean"),
        "binary_tv_max": ("binary_tv", "max"),
        "zero_adv_frac": ("zero_adv", "mean"),
        **{f"blocked_{r}": (f"blocked_{r}", "mean") for r in rules},
    }
    return df.groupby("step").agg(**aggs).reset_index().sort_values("step")


def timed(fn, repeat: int) -> tuple[float, object]:
    """The best wall time of `repeat` calls of `fn` and its last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", type=Path, default=DEFAULT_RUN)
    parser.add_argument("--repeat", type=int, default=3, help="timings per method; the best is kept")
    args = parser.parse_args(argv)
    if not (args.run / "run.json").exists():
        if args.run != DEFAULT_RUN:
            parser.error(f"{args.run} is not a run directory")
        subprocess.run([sys.executable, str(Path(__file__).with_name("synthetic_run.py"))], check=True)
    run = load_run(args.run)
    rules = list(run.rules)
    rows = run.tokens.select(pl.len()).collect().item()
    print(f"run: {args.run} ({rows:,} token rows, {len(rules)} rules)")

    t_pl, ours = timed(lambda: analysis.step_summary(load_run(args.run).tokens), args.repeat)
    t_pd, naive = timed(lambda: pandas_summary(args.run, rules), args.repeat)
    naive = pl.from_pandas(naive).with_columns(pl.col("step").cast(pl.Int32))
    for col in ours.columns:
        a, b = ours[col].cast(pl.Float64).to_numpy(), naive[col].cast(pl.Float64).to_numpy()
        if not np.allclose(a, b, rtol=1e-5, equal_nan=True):
            raise SystemExit(f"results differ in column {col!r}")
    print(f"per-step summary ({ours.height} steps), best of {args.repeat}:")
    print(f"  pandas (read every file, then group): {t_pd:8.2f} s")
    print(f"  trustlens.analysis.step_summary:      {t_pl:8.2f} s")
    print(f"  speed-up: {t_pd / t_pl:.1f}x (goal >= 5x)")

    tokens = run.tokens
    others = {
        "blocked_per_step": lambda: analysis.blocked_per_step(tokens),
        "blocked_by_token": lambda: analysis.blocked_by_token(tokens),
        "blocked_by_bucket": lambda: analysis.blocked_by_bucket(tokens),
        "blocked_by_advantage_sign": lambda: analysis.blocked_by_advantage_sign(tokens),
        "confusion_matrix": lambda: analysis.confusion_matrix(tokens),
        "rule_confusion": lambda: analysis.rule_confusion(tokens, rules[0], rules[-1]),
        "figure1_density(ratio)": lambda: analysis.figure1_density(tokens, "ratio", rules=rules[:1]),
        "mismatch_per_step": lambda: analysis.mismatch_per_step(tokens),
        "mismatch_by_bucket": lambda: analysis.mismatch_by_bucket(tokens),
        "step_signals": lambda: analysis.step_signals(run),
        "detect_collapse": lambda: analysis.detect_collapse(run),
    }
    print("other queries on the same run, best of 1:")
    for name, fn in others.items():
        t, out = timed(fn, 1)
        print(f"  {name:28s} {t:6.2f} s  ({out.height} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
