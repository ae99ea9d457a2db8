"""The watcher's cost per new step (`trustlens watch`): CPU per step on runs of 100 and of 10,000
steps, and the memory it holds.

    python benchmarks/live_watch.py [--steps 100 10000] [--last 50] [--doctor] [--dir DIR]

Each run is a synthetic run (trustlens.synthetic: `--samples` samples of up to `--seq-len`
tokens per step, one part file per table and step, collapsing 40 steps before its end so that
its alerts fall in the measured steps), written first by a child process. The benchmark then
publishes its part files step by step into a second folder (hard links: a part appears whole, as
a writer's rename makes it), and after each step runs what one poll of `trustlens watch` runs:
`RunFollower.poll()` and `LiveMonitor.update` for each completed step. Reported per run: the CPU
seconds (process time) of that per step, median and mean over the last `--last` steps, and the
resident memory of the process after the first 100 steps and at the end; then each run's median
over the first run's, measured in the same process. A watcher that reads only new parts and keeps
state bounded by its windows is flat: the same cost and memory at step 10,000 as at step 100.

DIR (default: a temporary folder in /dev/shm where it exists, else the system's, removed at the
end) holds the runs; a tmpfs spares writing the source runs the disk's fsync per part file (the
watcher's work is the same on any disk).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from trustlens.live import DoctorConfig, LiveMonitor
from trustlens.live.watch import judge
from trustlens.run import MANIFEST
from trustlens.run.follow import RunFollower
from trustlens.run.schema import part_name


def publish(source: Path, target: Path, step: int) -> None:
    """Make step `step`'s part files of `source` (part number = step) appear in `target`."""
    for table in ("tokens", "samples", "metrics"):
        folder = source / table / "rank=0"
        part = folder / part_name(step)
        if part.exists():
            (target / table / "rank=0").mkdir(parents=True, exist_ok=True)
            os.link(part, target / table / "rank=0" / part_name(step))


# writes a source run in a child process, so that the measuring process holds only the watcher
WRITE = """
import sys
from trustlens.synthetic import write_synthetic_run
path, steps, samples, seq_len = sys.argv[1], *map(int, sys.argv[2:])
write_synthetic_run(path, steps=steps, samples_per_step=samples, seq_len=seq_len,
                    collapse_at=steps - COLLAPSE_BEFORE_END, rows_per_part=1, progress=True)
"""
# the collapse starts this many steps before the end: its alerts fall in the measured steps of every run
COLLAPSE_BEFORE_END = 40


def measure(root: Path, steps: int, *, samples: int, seq_len: int, last: int, doctor: bool) -> dict:
    """Write a run of `steps` steps, follow it step by step; CPU per step and memory (module docstring)."""
    source = root / f"source-{steps}"
    code = WRITE.replace("COLLAPSE_BEFORE_END", str(COLLAPSE_BEFORE_END))
    subprocess.run([sys.executable, "-c", code, str(source), str(steps), str(samples), str(seq_len)], check=True)
    live = root / f"live-{steps}"
    live.mkdir()
    manifest = json.loads((source / MANIFEST).read_text())
    (live / MANIFEST).write_text(json.dumps({**manifest, "status": "running"}))
    follower = RunFollower(live)
    monitor = LiveMonitor(manifest, doctor=DoctorConfig() if doctor else None)
    process = psutil.Process()
    cpu: list[float] = []
    rss_early = 0
    alerts = 0
    for step in range(steps):
        publish(source, live, step)
        start = time.process_time()
        update = follower.poll()
        for rows in update.steps:
            alerts += len(judge(monitor, rows))
        cpu.append(time.process_time() - start)
        if step == min(100, steps) - 1:
            rss_early = process.memory_info().rss
    tail = cpu[-last:]
    return {
        "steps": steps,
        "median_ms": 1e3 * statistics.median(tail),
        "mean_ms": 1e3 * statistics.fmean(tail),
        "rss_early_mb": rss_early / 2**20,
        "rss_end_mb": process.memory_info().rss / 2**20,
        "alerts": alerts,  # LiveAlerts returned: raised, changed or made final
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[100, 10_000], help="run lengths [100 10000]")
    parser.add_argument("--last", type=int, default=50, help="steps at the end of each run measured [50]")
    parser.add_argument("--samples", type=int, default=8, help="samples per step [8]")
    parser.add_argument("--seq-len", type=int, default=16, help="longest response, tokens [16]")
    parser.add_argument("--doctor", action="store_true", help="run the doctor's checks too (watch --doctor)")
    parser.add_argument("--dir", type=Path, default=None, help="where the runs are written [a temporary folder]")
    args = parser.parse_args()
    for steps in args.steps:
        if steps < max(100, args.last):
            raise SystemExit(f"--steps must each be at least max(100, --last), got {steps}")
    shm = Path("/dev/shm")
    base = args.dir or Path(tempfile.mkdtemp(prefix="trustlens-live-watch-", dir=shm if shm.is_dir() else None))
    base.mkdir(parents=True, exist_ok=True)
    try:
        rows = [
            measure(base, steps, samples=args.samples, seq_len=args.seq_len, last=args.last, doctor=args.doctor)
            for steps in args.steps
        ]
    finally:
        if args.dir is None:  # a temporary folder: its runs are not kept
            shutil.rmtree(base, ignore_errors=True)
    first = rows[0]["median_ms"]
    print(f"\nwatcher CPU per new step (median and mean over the last {args.last} steps), resident memory")
    print(
        "| run steps | CPU per step, median | mean | × first run | RSS after 100 steps | RSS at the end "
        "| alerts raised or changed |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['steps']:,} | {r['median_ms']:.1f} ms | {r['mean_ms']:.1f} ms | {r['median_ms'] / first:.2f} | "
            f"{r['rss_early_mb']:.0f} MB | {r['rss_end_mb']:.0f} MB | {r['alerts']} |"
        )


if __name__ == "__main__":
    main()
