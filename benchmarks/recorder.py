"""Benchmark: TokenRecorder against writing the same rows with one pyarrow.parquet.write_table call.

    python benchmarks/recorder.py [--rows 2000000] [--batch 64] [--seq 1024] [--rounds 5]

Records `--rows` token rows (batches of B × T positions, responses 50–100% of T long) with 8
rules evaluated (every rule that needs no logits: ppo, ppo_clip_higher, minirl, dppo_binary_tv,
dppo_binary_kl, both *_recompute rules, grpo_tis), μ, π_old, π, entropy and per-sequence
advantages given, token texts decoded by a stand-in tokenizer. All measured in this run, on one torch thread:

- floor: the run's final token table (read back from its part files) written with a single
  `pq.write_table` call, the median of 3; once with pyarrow's default options (the issue's
  baseline) and once with the recorder's own (zstd, dictionary encoding only where values
  repeat, about three quarters of the default's write time: the stricter baseline).
- wall-clock and CPU time (process CPU for totals, the calling thread's CPU inside `record`):
  on a machine shared with other jobs the CPU-time ratios are the stable ones.
- unpaced: `record` called back to back, then `close()`. Total wall time / floor (goal ≤ 1.5×)
  and rows/s. Here the caller outruns the writer, so `record` mostly waits on the full queue.
- paced: between calls the "training step" sleeps 1.5× the stricter floor's time per batch (a trainer
  whose step lasts 1.5× what it takes to write that step's rows: far faster than any real one)
  and, in the "fresh" runs, makes the inputs of its next `record` call (a copy of a batch), as a
  trainer's forward pass does, so that `record` reads them from the cache: the goal applies to
  these. The "cold" runs of each round read inputs made long before, from memory (how this
  benchmark measured until 2026-11-26), for comparison.
  Time the caller is blocked inside `record` / the raw `pq.write_table` (pyarrow defaults) of the
  same rows (goal ≤ 5%), split into the caller's own work (argument checks, the copy) and waiting on
  the writer's full queue. Noise-dominated on a loaded machine: `--rounds` paced runs, each
  against a floor measured right before it, and the median of their ratios.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from trustlens import TokenRecorder, load_run
from trustlens.run.parts import write_options

RULES = [
    "ppo",
    "ppo_clip_higher",
    "minirl",
    "dppo_binary_tv",
    "dppo_binary_kl",
    "dppo_binary_tv_recompute",
    "dppo_binary_kl_recompute",
    "grpo_tis",
]


class Tokenizer:
    """Stands in for a real tokenizer: a distinct short text per id."""

    def decode(self, ids: list[int]) -> str:
        return f" tok{ids[0]}"


def make_batches(n: int, batch: int, seq: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """`n` distinct batches of realistic inputs (cycled, so that input generation is not timed)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        mu = -torch.distributions.Exponential(2.0).sample((batch, seq)).clamp(min=1e-6)
        lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=g)
        out.append(
            {
                "token_ids": torch.randint(0, 32_000, (batch, seq), generator=g),
                "response_mask": torch.arange(seq)[None, :] < lengths[:, None],
                "mu_logp": mu,
                "old_logp": (mu + 0.05 * torch.randn(batch, seq, generator=g)).clamp(max=0),
                "pi_logp": (mu + 0.1 * torch.randn(batch, seq, generator=g)).clamp(max=0),
                "entropy": torch.rand(batch, seq, generator=g) * 3,
                "advantages": torch.randn(batch, generator=g),
            }
        )
    return out


def limit_mask(mask: torch.Tensor, rows: int) -> torch.Tensor:
    """`mask` keeping only its first `rows` valid positions (row-major)."""
    return mask & (mask.reshape(-1).cumsum(0).reshape(mask.shape) <= rows)


def record_run(run_dir: Path, batches, rows: int, pace: float, fresh: bool = False) -> dict[str, float]:
    """Record `rows` rows. Returns wall and CPU times (CPU: of the whole process for the total,
    of the calling thread inside record), and the time spent waiting on the writer's queue.
    pace: seconds of "training step" (a sleep) between calls. fresh: the step also makes the
    inputs of its `record` call (a copy of the next batch), as a trainer's forward pass does, so
    they are in the cache when `record` reads them; else they were made long before (cold)."""
    inside = inside_cpu = 0.0
    recorded = step = 0
    start, start_cpu = time.perf_counter(), time.process_time()
    rec = TokenRecorder(run_dir, rules=RULES, tokenizer=Tokenizer())
    while recorded < rows:
        batch = batches[step % len(batches)]
        mask = limit_mask(batch["response_mask"], rows - recorded)
        if fresh:
            batch = {k: v.clone() for k, v in batch.items()}
        t, t_cpu = time.perf_counter(), time.thread_time()
        recorded += rec.record(step, **{**batch, "response_mask": mask})
        inside += time.perf_counter() - t
        inside_cpu += time.thread_time() - t_cpu
        step += 1
        if pace:
            time.sleep(pace)
    rec.close()
    return {
        "total": time.perf_counter() - start,
        "total_cpu": time.process_time() - start_cpu,
        "inside": inside,
        "inside_cpu": inside_cpu,
        "waiting": rec.stats.blocked_seconds,
        "steps": step,
    }


def time_write(table: pa.Table, path: Path, options: dict) -> tuple[float, float]:
    """Median (wall, CPU) seconds of 3 `pq.write_table(table, path, **options)` calls."""
    walls, cpus = [], []
    for _ in range(3):
        t, t_cpu = time.perf_counter(), time.process_time()
        pq.write_table(table, path, **options)
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - t_cpu)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="token rows to record")
    parser.add_argument("--batch", type=int, default=64, help="B: responses per record call")
    parser.add_argument("--seq", type=int, default=1024, help="T: positions per response")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5, help="paced rounds; the median ratio is reported")
    args = parser.parse_args()
    torch.set_num_threads(1)
    batches = make_batches(4, args.batch, args.seq, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        record_run(tmp / "warm-up", batches, 10_000, pace=0.0)  # first-use imports, not timed
        unpaced = record_run(tmp / "unpaced", batches, args.rows, pace=0.0)
        table = pa.concat_tables(pq.read_table(f) for f in load_run(tmp / "unpaced").files["tokens"])
        floors = {
            "pyarrow defaults": time_write(table, tmp / "floor.parquet", {}),
            "recorder's options": time_write(table, tmp / "floor.parquet", write_options(table.schema)),
        }
        shutil.rmtree(tmp / "unpaced")
        pace = 1.5 * floors["recorder's options"][0] / unpaced["steps"]
        rounds = []  # per round: the floor, then a paced run with fresh inputs and one with cold
        for r in range(args.rounds):
            floor = time_write(table, tmp / "floor.parquet", {})
            runs = {}
            for inputs in ("fresh", "cold"):
                runs[inputs] = record_run(tmp / f"paced{r}", batches, args.rows, pace=pace, fresh=inputs == "fresh")
                shutil.rmtree(tmp / f"paced{r}")
            rounds.append((floor, runs))

    rows = args.rows
    print(
        f"recorder benchmark: {rows:,} token rows, {len(RULES)} rules, batches of "
        f"{args.batch}×{args.seq} ({unpaced['steps']} record calls), 1 torch thread"
    )
    print("(wall-clock ratios suffer from other load on the machine; CPU-time ratios much less)")
    print(
        f"unpaced: record back to back, then close(): wall {unpaced['total']:.3f} s, "
        f"CPU {unpaced['total_cpu']:.3f} s, {rows / unpaced['total']:,.0f} rows/s; inside record "
        f"{unpaced['inside']:.3f} s, of which waiting on the full queue {unpaced['waiting']:.3f} s"
    )
    for name, (wall, cpu) in floors.items():
        print(f"floor = one pq.write_table, {name}: wall {wall:.3f} s, CPU {cpu:.3f} s")
        print(
            f"  unpaced total / floor (goal ≤ 1.5×):   wall {unpaced['total'] / wall:5.2f}×   "
            f"CPU {unpaced['total_cpu'] / cpu:5.2f}×"
        )
    print(f"paced: {pace * 1e3:.1f} ms of training step between calls; caller blocked in record / raw write_table:")
    for inputs in ("fresh", "cold"):
        print(f" {inputs} inputs:")
        ratios, cpu_ratios = [], []
        for r, ((wall, cpu), runs) in enumerate(rounds):
            paced = runs[inputs]
            work = paced["inside"] - paced["waiting"]
            ratios.append(paced["inside"] / wall)
            cpu_ratios.append(paced["inside_cpu"] / cpu)
            print(
                f"  round {r}: floor {wall:.3f} s; inside record {paced['inside']:.3f} s = {ratios[-1]:6.2%} "
                f"(own work {work / wall:.2%}, queue {paced['waiting'] / wall:.2%}); CPU {cpu_ratios[-1]:6.2%}"
            )
        goal = " (goal ≤ 5%)" if inputs == "fresh" else ""
        print(
            f"  median of {len(rounds)} rounds{goal}: wall {statistics.median(ratios):.2%}, "
            f"CPU {statistics.median(cpu_ratios):.2%}"
        )


if __name__ == "__main__":
    main()
