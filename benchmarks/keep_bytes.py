"""Bytes on disk per trained token: the built-in run recorded in full and with Keep(rate).

    python benchmarks/keep_bytes.py [--steps 10] [--rate 0.01] [--preset default] [--before TREE]

Trains the same seeded run (the recording never changes the training) with every rule of the
registry evaluated, once recording every token and once with `--keep-rate`, and prints the bytes
of the token rows (plus, for a sampled run, the aggregates table) per trained token and their
ratio to the full run. `--before TREE`: a checkout of an earlier trustlens (e.g. `git worktree
add /tmp/old bea0ccc`), whose sampled recording of the same run is measured too, in a process of
its own. Then checks that the sampled run's aggregates are exact: its per-step block counts of
every rule and its per-step scalars (block rates, zero-advantage share, token-level mismatch)
equal those of the full run's rows. The goal of issue 46: ≤ 2 bytes per trained token at rate
0.01 with all the rules evaluated. Each table gets a part file, with its footer, every
`flush_seconds` (30 s), and a slower (or loaded) machine writes more of them: the footers are
printed apart. A sampled run's parts are merged into one per table when it closes
(trustlens.run.compact); the full run's are not.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from trustlens import load_run
from trustlens.analysis import blocked_per_step, exact_aggregates
from trustlens.export import step_scalars
from trustlens.rules import RULES
from trustlens.train.config import config_from_preset
from trustlens.train.trainer import train

TRAIN = (
    "import sys; from pathlib import Path; from trustlens.train.config import config_from_preset; "
    "from trustlens.train.trainer import train; preset, steps, rate, out = sys.argv[1:]; "
    "train(config_from_preset(preset, steps=int(steps), eval_size=0, keep_rate=float(rate)), Path(out), "
    "progress=False)"
)


def table_bytes(run_dir: Path, *tables: str) -> int:
    return sum(f.stat().st_size for t in tables for f in (run_dir / t).rglob("*.parquet"))


def footers(run_dir: Path, *tables: str) -> tuple[int, int]:
    """(part files, bytes of their footers: the metadata and the closing length and magic)."""
    files = [f for t in tables for f in (run_dir / t).rglob("*.parquet")]
    return len(files), sum(pq.read_metadata(f).serialized_size + 8 for f in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps [10]")
    parser.add_argument("--rate", type=float, default=0.01, help="Keep rate of the sampled run [0.01]")
    parser.add_argument("--preset", default="default", help="training preset [default]")
    parser.add_argument("--before", type=Path, default=None, help="an earlier trustlens checkout to measure too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: Path(tmp) / name for name in ("full", "sampled", "before")}
        for name, rate in (("full", None), ("sampled", args.rate)):
            cfg = config_from_preset(args.preset, steps=args.steps, eval_size=0, keep_rate=rate)
            train(cfg, runs[name], progress=False)
        if args.before is not None:
            env = {**os.environ, "PYTHONPATH": str(args.before.resolve())}
            command = [sys.executable, "-c", TRAIN, args.preset, str(args.steps), str(args.rate), str(runs["before"])]
            subprocess.run(command, env=env, check=True, cwd=args.before)
        full, sampled = load_run(runs["full"]), load_run(runs["sampled"])
        evaluated = [
            r for r in RULES if sampled.aggregates.select(pl.col(f"k_{r}_pos").is_not_null().all()).collect().item()
        ]
        trained = sampled.aggregates.select(pl.col("tokens").sum()).collect().item()
        full_rows = full.tokens.select(pl.len()).collect().item()
        assert full_rows == trained, "the full run recorded another number of tokens than were trained"
        b_full = table_bytes(runs["full"], "tokens")
        tables = {"full": ("tokens",), "sampled": ("tokens", "aggregates"), "before": ("tokens", "aggregates")}
        print(
            f"preset {args.preset!r}, {args.steps} steps: {trained:,} trained tokens, "
            f"{len(evaluated)} of the {len(RULES)} rules evaluated on every step"
        )
        print(f"full:    {full_rows:,} rows, {b_full:,} B = {b_full / trained:.2f} B per trained token")
        parts, footer = footers(runs["full"], *tables["full"])
        print(f"         of which the footers of its {parts} part files: {footer:,} B = {footer / trained:.2f} B/token")
        measured = ["sampled", *(["before"] if args.before is not None else [])]
        for name in measured:
            rows = load_run(runs[name]).tokens.select(pl.len()).collect().item()
            size = table_bytes(runs[name], "tokens", "aggregates")
            label = "sampled" if name == "sampled" else f"before ({args.before})"
            print(
                f"{label}: {rows:,} rows ({rows / trained:.2%}) + aggregates, {size:,} B = "
                f"{size / trained:.2f} B per trained token (goal ≤ 2); {size / b_full:.3f}× the full run"
            )
            parts, footer = footers(runs[name], *tables[name])
            print(
                f"         of which the footers of its {parts} part files: {footer:,} B = {footer / trained:.2f} B per "
                f"token; without them {(size - footer) / trained:.2f} B per token"
            )
        want = blocked_per_step(full.tokens, evaluated)
        got = blocked_per_step(sampled.tokens, evaluated, aggregates=exact_aggregates(sampled))
        keys = ["step", "rule", "count", "blocked"]
        same = got.select(keys).equals(want.select(keys))
        verdict = "equal" if same else "DIFFER"
        print(f"per-step block counts of the {len(evaluated)} rules, aggregates vs full rows: {verdict}")
        exact = step_scalars(sampled).rename({"value": "exact"})
        truth = step_scalars(full).rename({"value": "rows"})
        both = exact.join(truth, on=["step", "name"], how="inner").filter(~pl.col("name").str.starts_with("time/"))
        worst = both.select((pl.col("exact") - pl.col("rows")).abs().max()).item()
        rates = both.filter(pl.col("name").str.starts_with("blocked/")).select(pl.col("name").n_unique()).item()
        print(
            "per-step scalars (wall times aside) of the sampled run vs the full run: "
            f"{both.height} compared ({rates} block rates by rule and sign), largest difference {worst:.3g}"
        )
        if not same or worst > 1e-9:
            raise SystemExit("the sampled run's aggregates are not exact")


if __name__ == "__main__":
    main()
