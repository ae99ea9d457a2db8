"""Write a large synthetic run (10M token rows by default) for the scale benchmarks and the
dashboard's scale check.

    python benchmarks/synthetic_run.py [--out DIR] [--tokens N] [--collapse-at STEP] [--keep-rate R]

With --keep-rate the run is recorded sampled, as `TokenRecorder(keep=Keep(rate=R))` records it:
every token that matters and an R share of the rest, plus the exact aggregates of all tokens
(`--tokens 1e9 --keep-rate 0.01` writes the run of benchmarks/out_of_core.py).

Prints the rows written, the time taken, rows/s, the size on disk, the peak resident memory
of the generator (it streams step by step, so memory does not grow with the run), and what
`load_run`'s page-checksum verification costs: the first load (every part verified) against a
second one in the same process (nothing left to verify), `verify=False`, and reading every token
row (`tokens.collect()`).
"""

from __future__ import annotations

import argparse
import math
import resource
import shutil
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import torch

from trustlens import Keep
from trustlens.run import load_run
from trustlens.synthetic import DEFAULT_RULES, expected_token_rows, write_synthetic_run

COLLECT_AT_MOST = 20_000_000  # token rows read into memory at once to time a full read
DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "synthetic-10m"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="run directory (replaced if it exists)")
    parser.add_argument("--tokens", type=float, default=10_000_000, help="approximate tokens trained (1e9 works)")
    parser.add_argument("--samples-per-step", type=int, default=512)
    parser.add_argument("--seq-len", type=int, default=256, help="longest response; lengths are 50–100%% of it")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument(
        "--collapse-at", type=float, default=0.75, help="collapse from this fraction of the steps on (negative: none)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--keep-rate", type=float, default=None, help="record sampled: Keep(rate=R) (default: every row)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    per_step = expected_token_rows(1, args.samples_per_step, args.seq_len)
    steps = max(1, math.ceil(args.tokens / per_step))
    collapse_at = int(steps * args.collapse_at) if args.collapse_at >= 0 else None
    if args.out.exists():
        shutil.rmtree(args.out)
    start = time.perf_counter()
    write_synthetic_run(
        args.out,
        steps=steps,
        samples_per_step=args.samples_per_step,
        seq_len=args.seq_len,
        rules=DEFAULT_RULES,
        world_size=args.world_size,
        collapse_at=collapse_at,
        seed=args.seed,
        progress=True,
        keep=None if args.keep_rate is None else Keep(rate=args.keep_rate, seed=args.seed),
    )
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    load_seconds = []
    for verify in (True, True, False):
        t = time.perf_counter()
        run = load_run(args.out, verify=verify)
        load_seconds.append(time.perf_counter() - t)
    rows = sum(pq.read_metadata(f).num_rows for f in run.files["tokens"])
    read = "skipped: a table this large may not fit in memory (benchmarks/out_of_core.py)"
    if rows <= COLLECT_AT_MOST:
        t = time.perf_counter()
        run.tokens.collect()
        read = f"{time.perf_counter() - t:.2f} s"
    trained = int(run.aggregates.select(pl.col("tokens").sum()).collect().item()) if run.sampled else rows
    size = sum(f.stat().st_size for f in args.out.rglob("*.parquet"))
    token_size = sum(
        f.stat().st_size for table in ("tokens", "aggregates") for f in (args.out / table).rglob("*.parquet")
    )
    print(f"run:        {args.out}")
    print(f"tokens:     {trained:,} trained over {steps} steps ({args.world_size} ranks, collapse at {collapse_at})")
    print(f"token rows: {rows:,} ({rows / trained:.2%} of the tokens)")
    print(f"time:       {seconds:.1f} s ({trained / seconds:,.0f} tokens/s)")
    print(
        f"on disk:    {size / 2**20:,.0f} MiB; token rows + aggregates {token_size / 2**20:,.0f} MiB "
        f"({token_size / trained:.2f} bytes per trained token)"
    )
    print(f"peak RSS:   {peak_mb:.0f} MiB (writing)")
    print(
        f"load_run:   first (verifies every part's page checksums) {load_seconds[0]:.2f} s; again in this "
        f"process {load_seconds[1]:.3f} s; verify=False {load_seconds[2]:.3f} s; tokens.collect() {read}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
