"""Time of `trustlens import` on a large TensorBoard log: STEPS steps × TAGS scalar tags.

    python benchmarks/import_log.py [--steps 10000] [--tags 50] [--out DIR]

Writes the log as verl's TensorBoard logger does (one event per scalar, `add_scalar(key, value,
step)`: here the frames are written directly, byte for byte what a SummaryWriter writes for a
simple_value), then times, each in this process:

    trustlens      import_log(LOGDIR, RUN): read, map the names, write the run
    EventAccumulator   tensorboard's own reader (tensorboard.backend.event_processing), reading
                   every scalar (size_guidance 0), the baseline

and prints the seconds (wall and CPU: on a loaded machine the wall time is the CPU time plus the
wait for a core) and the ratio. The goal of issue 51: ≤ 5 s for 10,000 steps × 50 tags on
2 cores (docs/import.md gives the measured numbers, with the machine).
"""

from __future__ import annotations

import argparse
import os
import struct
import tempfile
import time
from pathlib import Path

from trustlens.ingest import import_log
from trustlens.ingest.events import masked_crc32c

# verl's names first (mapped), then other tags (kept as logged)
VERL = [
    "actor/entropy",
    "actor/grad_norm",
    "actor/pg_clipfrac",
    "critic/score/mean",
    "rollout_corr/k3_kl",
    "rollout_corr/kl",
    "training/rollout_probs_diff_mean",
    "response_length/mean",
]


def write_log(folder: Path, steps: int, tags: int) -> Path:
    """An event file of `steps` × `tags` scalars, one Event each; its path."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    names = (VERL + [f"timing_s/stage_{i}" for i in range(tags)])[:tags]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "events.out.tfevents.1700000000.host.1.0"

    def frame(data: bytes) -> bytes:
        header = struct.pack("<Q", len(data))
        return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))

    with open(path, "wb") as f:
        f.write(frame(event_pb2.Event(wall_time=1.7e9, file_version="brain.Event:2").SerializeToString()))
        for step in range(steps):
            for n, name in enumerate(names):
                value = summary_pb2.Summary.Value(tag=name, simple_value=1.0 / (1 + step + n))
                event = event_pb2.Event(wall_time=1.7e9 + step, step=step, summary=summary_pb2.Summary(value=[value]))
                f.write(frame(event.SerializeToString()))
    return path


def baseline(folder: Path) -> int:
    """Every scalar read with tensorboard's EventAccumulator; the number read."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return sum(len(acc.Scalars(tag)) for tag in acc.Tags()["scalars"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--tags", type=int, default=50)
    parser.add_argument("--out", type=Path, default=None, help="where the log and the run go [a temporary folder]")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="import_bench_"))
    t = time.perf_counter()
    path = write_log(root / "tb", args.steps, args.tags)
    size = path.stat().st_size / 2**20
    print(f"log: {args.steps:,} steps × {args.tags} tags, {size:.1f} MiB, written in {time.perf_counter() - t:.1f} s")
    t, cpu = time.perf_counter(), time.process_time()
    done = import_log(root / "tb", root / "run", overwrite=True)
    ours, ours_cpu = time.perf_counter() - t, time.process_time() - cpu
    assert done.table.metrics.height == args.steps * args.tags, done.table.metrics.height
    t, cpu = time.perf_counter(), time.process_time()
    n = baseline(root / "tb")
    theirs, theirs_cpu = time.perf_counter() - t, time.process_time() - cpu
    assert n == args.steps * args.tags, n
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    values = f"{done.table.metrics.height:,} values, {len(done.table.renamed)} names mapped"
    print(f"trustlens import: {ours:.2f} s wall, {ours_cpu:.2f} s CPU ({values})")
    print(f"EventAccumulator (read only): {theirs:.2f} s wall, {theirs_cpu:.2f} s CPU")
    print(f"ratio import / EventAccumulator: {ours / theirs:.2f} wall, {ours_cpu / theirs_cpu:.2f} CPU")


if __name__ == "__main__":
    main()
