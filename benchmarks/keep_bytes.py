"""Bytes on disk per trained token: the built-in run recorded in full and with Keep(rate).

    python benchmarks/keep_bytes.py [--steps 10] [--rate 0.01] [--preset default]

Trains the same seeded run twice (the recording never changes the training), once recording
every token and once with `--keep-rate`, and prints the bytes of the token rows (plus, for the
sampled run, the aggregates table) per trained token, their ratio, and the largest difference
between the sampled run's exact per-step scalars (from its aggregates) and the full run's (from
its rows). The goal of the run-format issue: ≤ 2 bytes per trained token at rate 0.01.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import polars as pl

from trustlens import load_run
from trustlens.export import step_scalars
from trustlens.train.config import config_from_preset
from trustlens.train.trainer import train


def table_bytes(run_dir: Path, *tables: str) -> int:
    return sum(f.stat().st_size for t in tables for f in (run_dir / t).rglob("*.parquet"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps [10]")
    parser.add_argument("--rate", type=float, default=0.01, help="Keep rate of the sampled run [0.01]")
    parser.add_argument("--preset", default="default", help="training preset [default]")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for name, rate in (("full", None), ("sampled", args.rate)):
            cfg = config_from_preset(args.preset, steps=args.steps, eval_size=0, keep_rate=rate)
            train(cfg, Path(tmp) / name, progress=False)
            runs[name] = Path(tmp) / name
        full, sampled = load_run(runs["full"]), load_run(runs["sampled"])
        trained = sampled.aggregates.select(pl.col("tokens").sum()).collect().item()
        rows = {n: r.tokens.select(pl.len()).collect().item() for n, r in (("full", full), ("sampled", sampled))}
        assert rows["full"] == trained, "the full run recorded another number of tokens than were trained"
        b_full = table_bytes(runs["full"], "tokens")
        b_sampled = table_bytes(runs["sampled"], "tokens", "aggregates")
        print(f"preset {args.preset!r}, {args.steps} steps: {trained:,} trained tokens")
        print(f"full:    {rows['full']:,} rows, {b_full:,} B = {b_full / trained:.2f} B per trained token")
        print(
            f"sampled: {rows['sampled']:,} rows ({rows['sampled'] / trained:.2%}) + aggregates, {b_sampled:,} B = "
            f"{b_sampled / trained:.2f} B per trained token (goal ≤ 2); {b_sampled / b_full:.3f}× the full run"
        )
        exact = step_scalars(sampled).rename({"value": "exact"})
        truth = step_scalars(full).rename({"value": "rows"})
        both = exact.join(truth, on=["step", "name"], how="inner").filter(~pl.col("name").str.starts_with("time/"))
        worst = both.select((pl.col("exact") - pl.col("rows")).abs().max()).item()
        print(
            "per-step scalars (wall times aside) of the sampled run vs the full run: "
            f"{both.height} compared, largest difference {worst:.3g}"
        )


if __name__ == "__main__":
    main()
