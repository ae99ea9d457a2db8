"""The watcher's cost per new step (`trustlens watch`): CPU per step on runs of 100 and of 10,000
steps, and the memory it holds; with `--latency`, how soon `trustlens watch --json` prints an
alert raised live, locally and on an object store.

    python benchmarks/live_watch.py [--steps 100 10000] [--last 50] [--doctor] [--dir DIR]
    python benchmarks/live_watch.py --latency [--latency-steps 40] [--pause 0.5] [--every 1] [--no-s3]

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

`--latency`: a child process records a run through `TokenRecorder(alerts=True)` (the recorder's
defaults otherwise: flush_seconds 30 s), `--pause` seconds of "training" per step, the entropy
falling at step 25 (a critical entropy_collapse raised at step 26); it notes the wall time of each
step's end (just before `end_step`). A second child runs `trustlens watch RUN --json --every S`,
and the benchmark notes when each of its lines arrives. Reported per alert printed: the seconds
from the end of the step that raised it (`raised_at_step`) to its line, against the recorder's own
latency (from the step's end to the alert raised on the writer thread, `LiveTap.latency`), once on
a local disk (DIR) and once on a moto S3 server on 127.0.0.1 (skipped with `--no-s3`, or when moto
is not installed). The watcher polls every S seconds, so about S/2 of the latency is its wait.
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


# records a run with live alerts, noting when each step ended: argv run, log, steps, pause
WRITE_LIVE = """
import json, sys, time
import torch
from trustlens import TokenRecorder
run, log, steps, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
B, T = 16, 16
g = torch.Generator().manual_seed(0)
with open(log, "w") as out:
    with TokenRecorder(run, rules=["ppo"], alerts=True, planned_steps=steps) as rec:
        for step in range(steps):
            mu = -torch.rand(B, T, generator=g) - 0.1
            rec.record(step, token_ids=torch.randint(0, 9, (B, T), generator=g), response_mask=torch.ones(B, T),
                       pi_logp=mu, mu_logp=mu, advantages=torch.randn(B, generator=g),
                       entropy=torch.full((B, T), 1.0 if step < 25 else 0.2))
            rec.log_samples(step, rewards=[1.0] * B)
            time.sleep(pause)  # the rest of the training step
            out.write(json.dumps({"step": step, "ended": time.time()}) + "\\n")
            out.flush()
            rec.end_step(step)
    out.write(json.dumps({"recorder_latency": rec._live.latency}) + "\\n")
"""


def latency(run: str, folder: Path, *, steps: int, pause: float, every: float, env: dict[str, str]) -> dict:
    """Record a run with live alerts and follow it with `watch --json` (module docstring)."""
    import threading

    log = folder / "steps.jsonl"
    writer = subprocess.Popen([sys.executable, "-c", WRITE_LIVE, run, str(log), str(steps), str(pause)], env=env)
    while not (log.exists() and log.read_text()):  # run.json is written before the first step ends
        if writer.poll() is not None:
            raise SystemExit(f"the writer of {run} exited with {writer.returncode}")
        time.sleep(0.05)
    command = [sys.executable, "-m", "trustlens.cli", "watch", run, "--json", "--every", str(every)]
    watcher = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    lines: list[tuple[float, dict]] = []

    def read() -> None:
        assert watcher.stdout is not None
        for line in watcher.stdout:
            lines.append((time.time(), json.loads(line)))

    reader = threading.Thread(target=read)
    reader.start()
    writer.wait()
    watcher.wait(timeout=120)
    reader.join()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    ended = {r["step"]: r["ended"] for r in records if "step" in r}
    own = next(r["recorder_latency"] for r in records if "recorder_latency" in r)
    printed = [
        (row["kind"], row["severity"], row["raised_at_step"], at - ended[row["raised_at_step"]])
        for at, row in lines
        if row.get("event") == "alert" and row.get("live")
    ]
    return {"printed": printed, "recorder": own, "exit": watcher.returncode}


def s3_env(folder: Path) -> tuple[dict[str, str], object] | None:
    """Environment variables pointing at a moto S3 server on 127.0.0.1 with a bucket, and the
    server; None when moto or boto3 is missing."""
    import logging
    import socket

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError:
        return None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket="trustlens-bench")
    return env, server


def latency_main(args: argparse.Namespace, base: Path) -> None:
    places: list[tuple[str, str, dict[str, str]]] = [("local disk", str(base / "live-run"), dict(os.environ))]
    server = None
    if not args.no_s3:
        found = s3_env(base)
        if found is None:
            print("moto or boto3 is not installed: the S3 run is skipped")
        else:
            env, server = found
            places.append(("moto S3 on 127.0.0.1", "s3://trustlens-bench/live-run", env))
    try:
        rows = []
        for name, run, env in places:
            folder = base / name.split()[0]
            folder.mkdir()
            rows.append(
                (name, latency(run, folder, steps=args.latency_steps, pause=args.pause, every=args.every, env=env))
            )
    finally:
        if server is not None:
            server.stop()  # type: ignore[attr-defined]
    print(f"\nfrom the end of the step that raised an alert to `watch --json --every {args.every:g}` printing it")
    print("| run | alert | raised at step | latency | the recorder's own (step end → raised) | watch exit |")
    print("|---|---|---|---|---|---|")
    for name, r in rows:
        own = statistics.median(r["recorder"]) if r["recorder"] else float("nan")
        for kind, severity, step, seconds in r["printed"]:
            print(f"| {name} | {severity} {kind} | {step} | {seconds:.2f} s | {own:.3f} s | {r['exit']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[100, 10_000], help="run lengths [100 10000]")
    parser.add_argument("--last", type=int, default=50, help="steps at the end of each run measured [50]")
    parser.add_argument("--samples", type=int, default=8, help="samples per step [8]")
    parser.add_argument("--seq-len", type=int, default=16, help="longest response, tokens [16]")
    parser.add_argument("--doctor", action="store_true", help="run the doctor's checks too (watch --doctor)")
    parser.add_argument("--dir", type=Path, default=None, help="where the runs are written [a temporary folder]")
    parser.add_argument("--latency", action="store_true", help="measure the latency to `watch --json` instead")
    parser.add_argument("--latency-steps", type=int, default=40, help="--latency: steps of the run [40]")
    parser.add_argument("--pause", type=float, default=0.5, help="--latency: seconds of training per step [0.5]")
    parser.add_argument("--every", type=float, default=1.0, help="--latency: watch's seconds between polls [1]")
    parser.add_argument("--no-s3", action="store_true", help="--latency: only the local run")
    args = parser.parse_args()
    if args.latency:
        base = args.dir or Path(tempfile.mkdtemp(prefix="trustlens-live-latency-"))
        base.mkdir(parents=True, exist_ok=True)
        try:
            latency_main(args, base)
        finally:
            if args.dir is None:
                shutil.rmtree(base, ignore_errors=True)
        return
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
