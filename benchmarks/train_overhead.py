"""What the TokenRecorder adds to a training step: the same run with TokenRecorder and NullRecorder.

    python benchmarks/train_overhead.py [--steps 12] [--repeats 2] [--preset default]

Both runs use the same seed and settings, so they sample the same tokens and do the same
updates; the only difference is the recording (per-token quantities, every rule evaluated,
Parquet written by the background writer). Runs alternate (null, recorder, null, recorder, …)
so that load changes on a shared machine hit both alike. Evaluation is switched off: it is not
part of a step. Prints the median step time of each and their ratio; the target is ≤ 1.03.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from trustlens.train.config import config_from_preset
from trustlens.train.trainer import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="training steps per run [12]")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each kind, alternating [2]")
    parser.add_argument("--preset", default="default", help="training preset [default]")
    parser.add_argument("--checkpoint", default=None, help="warm start (default: the shipped one)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for record in (False, True):
                cfg = config_from_preset(
                    args.preset, steps=args.steps, eval_size=0, record=record, checkpoint=args.checkpoint
                )
                result = train(cfg, Path(tmp) / f"run{i}", progress=False)
                times[record] += result.step_times[1:]  # the first step warms up allocators and caches
    null, rec = statistics.median(times[False]), statistics.median(times[True])
    print(f"steps measured per kind: {len(times[False])} (preset {args.preset!r}, {args.repeats} runs each)")
    print(f"median step time: NullRecorder {null:.3f} s, TokenRecorder {rec:.3f} s")
    print(f"ratio TokenRecorder / NullRecorder: {rec / null:.3f}  (target ≤ 1.03)")


if __name__ == "__main__":
    main()
