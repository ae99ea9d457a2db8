"""Live alerts (trustlens.live): online = offline, stopping on them, and their cost.

    python benchmarks/live.py --out DIR [--seeds 0,1,2] [--steps 250] [--dppo-steps 100]
                              [--cost-steps 1000] [--cost-block 1] [--cost-doses 1]
                              [--jobs 2] [--parts online,stop,cost]

online  Replays the shipped runs (data/sample_run) step by step through a LiveMonitor, and trains
        the collapse preset with pg_is and with dppo_binary_tv for each seed with live alerts on
        (the run's recorder raises them on its writer thread; the seed of a shipped run is read
        from it instead of trained again). Per run: whether the live alerts (kind, first step,
        severity, critical step) equal detect_collapse's on the finished run, the first critical
        alert's step, and its latency: from the step's end (the trainer's `end_step`, or for a
        replay the moment the step's rows are handed over) to the `on_alert` call (a replay: to
        the end of `update`).
stop    Trains the collapse preset with pg_is and `stop_on="critical"` per seed: the step it
        stopped at, the kept checkpoint's held-out accuracy (the run's evaluation at the
        checkpoint's step: a checkpoint holds the weights that evaluation measured, both taken
        before that step's update, every 10 steps), against the same seed's full run: its final
        and its best held-out accuracy.
cost    The built-in step (the default preset, 1 thread) with alerts on against off, within one
        run of `--cost-steps` steps, so that the machine's drift from run to run cancels: the
        monitor judges the steps of every other block of `--cost-block` steps. A step's judging
        runs on the writer thread while the next step trains, so a step counts as "on" when the
        step before it was judged. Mean seconds per step on and off, the cost (on − off) / off
        with its standard error, and the CPU time the live tap (gathering rows, the LiveMonitor)
        took on the writer thread per judged step (polars' worker threads not counted). With
        `--cost-doses 1,10`, a second run judges each judged step with 10 monitors: ten times the
        work, so a cost below what one run can resolve shows ten times larger; its cost and CPU
        are given per judging.

Prints Markdown tables. A run already in DIR with the same name is reused (delete it to train
again).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "data" / "sample_run"
SHIPPED_SEED = 1  # the shipped runs are the collapse preset's seed 1 (the "sample" preset)


def _key(a) -> tuple:
    return (a["kind"], a["signal"], a["step"], a["severity"], a["critical_step"])


def _offline(run) -> list[tuple]:
    from trustlens.analysis import detect_collapse

    return sorted(_key(r) for r in detect_collapse(run).to_dicts())


def _first_critical(keys: list[tuple]) -> int | None:
    steps = [k[4] for k in keys if k[3] == "critical"]
    return min(steps) if steps else None


def replay_row(name: str, path: Path) -> dict:
    """A recorded run fed step by step to a LiveMonitor (collapse alerts): online = offline,
    first critical step, latency of the step that raised it (the `update` call)."""
    from trustlens import load_run
    from trustlens.live import LiveMonitor, step_frames

    run = load_run(path)
    monitor = LiveMonitor.for_run(run, doctor=None)
    seconds: dict[int, float] = {}
    for step, frames in step_frames(run):
        t = time.perf_counter()
        monitor.update(step, **frames)
        seconds[step] = time.perf_counter() - t
    monitor.finish()
    online = sorted(_key(vars(a)) for a in monitor.alerts if a.source == "collapse")
    first = _first_critical(online)
    return {
        "run": name,
        "equal": online == _offline(run),
        "first_critical": first,
        "latency_s": seconds.get(first) if first is not None else None,
        "step_s": statistics.median(seconds.values()),
    }


def train_live(job: tuple[str, str, int, int, str, Path]) -> dict:
    """Train one collapse-preset run with live alerts on (in this process), recording when each
    step ended and when on_alert heard each alert."""
    import trustlens.train.trainer as trainer_module
    from trustlens.train.config import config_from_preset

    name, rule, seed, steps, stop_on, out = job
    ended: dict[int, float] = {}
    heard: list[tuple[object, float]] = []
    make = trainer_module.make_recorder

    def make_recorder(cfg, run_dir, tokenizer, rules):
        rec = make(cfg, run_dir, tokenizer, rules)
        if rec._live is not None and rec._live.calls is None:  # hear the alerts as on_alert does
            from trustlens.live.tap import AlertCalls

            rec._live.calls = AlertCalls(lambda a: heard.append((a, time.monotonic())))
        end_step = rec.end_step

        def timed_end_step(step):
            ended[step] = time.monotonic()
            end_step(step)

        rec.end_step = timed_end_step
        return rec

    trainer_module.make_recorder = make_recorder
    cfg = config_from_preset("collapse", rule=rule, seed=seed, steps=steps, alerts=True, stop_on=stop_on)
    if not (out / "run.json").exists():
        trainer_module.train(cfg, out, progress=False)
    latency = {}
    for alert, at in heard:
        if alert.severity == "critical" and alert.raised_at_step in ended:
            latency.setdefault((alert.kind, alert.step), at - ended[alert.raised_at_step])
    return {"name": name, "latency": latency, "path": out}


def live_row(name: str, path: Path, latency: dict) -> dict:
    from trustlens import live_alerts, load_run

    run = load_run(path)
    live = [a for a in live_alerts(run) if a.source == "collapse"]
    online = sorted(_key(vars(a)) for a in live)
    first = _first_critical(online)
    first_alert = next((a for a in live if a.critical_step == first), None)
    lat = None if first_alert is None else latency.get((first_alert.kind, first_alert.step))
    return {"run": name, "equal": online == _offline(run), "first_critical": first, "latency_s": lat, "step_s": None}


def accuracy(path: Path) -> dict[int, float]:
    import polars as pl

    from trustlens import load_run

    m = load_run(path).metrics.filter(pl.col("name") == "eval/accuracy").collect()
    return dict(zip(m["step"].to_list(), m["value"].to_list(), strict=True))


def stop_row(seed: int, stopped: Path, full: Path) -> dict:
    from trustlens import load_run

    why = load_run(stopped).manifest["stopped"]
    acc, full_acc = accuracy(stopped), accuracy(full)
    kept = None if not why else why["checkpoint_step"]
    last = max(full_acc)
    return {
        "seed": seed,
        "alert": None if not why else f"{why['alert']['kind']}, evidence from step {why['evidence_start_step']}",
        "stopped_at": None if not why else why["step"],
        "kept_step": kept,
        "kept_acc": None if kept is None else acc.get(kept),
        "final_acc": full_acc[last],
        "final_step": last,
        "best_acc": max(full_acc.values()),
        "best_step": max(full_acc, key=lambda s: full_acc[s]),
    }


def cost_row(out: Path, steps: int, block: int, dose: int) -> dict:
    """One default-preset run of `steps` steps with live alerts on, whose monitor judges the steps
    of every other block of `block` steps: a step's judging runs while the next step trains, so
    each step from the second on counts as "on" when the monitor judged the step before it, else
    "off". With `dose` > 1, a judged step is judged by `dose` monitors (the run's and dose − 1
    more, whose alerts go nowhere): `dose` times the work, so that a cost too small to resolve
    once shows `dose` times larger, and the cost per judging is the slope. Mean seconds per step
    on and off (± standard error), the cost per judging (on − off) / off / dose, and the live
    tap's writer-thread CPU per judging."""
    import trustlens.train.trainer as trainer_module
    from trustlens.analysis.seeds import mean_se
    from trustlens.live import LiveMonitor
    from trustlens.train.config import config_from_preset

    def judged(step: int) -> bool:
        return (step // block) % 2 == 0

    taps = []
    make = trainer_module.make_recorder

    def make_recorder(cfg, run_dir, tokenizer, rules):
        rec = make(cfg, run_dir, tokenizer, rules)
        tap = rec._live
        judge, shadows = tap._step, []

        def step_fn(step, tables, ended):
            if not judged(step):
                return None
            if not shadows:
                m = tap.monitor
                shadows.extend(LiveMonitor(m.manifest, tap.collapse, rank=m.rank) for _ in range(dose - 1))
            for shadow in shadows:
                shadow.update(step, **{t: b for t, b in tables.items() if b})
            return judge(step, tables, ended)

        tap._step = step_fn
        taps.append(tap)
        return rec

    trainer_module.make_recorder = make_recorder
    try:
        cfg = config_from_preset("default", steps=steps, eval_size=0, alerts=True)
        result = trainer_module.train(cfg, out / f"cost-{steps}-{block}-x{dose}", progress=False)
    finally:
        trainer_module.make_recorder = make
    times = {True: [], False: []}
    for step in range(1, len(result.step_times)):
        times[judged(step - 1)].append(result.step_times[step])
    (on, on_se, _), (off, off_se, _) = (mean_se(times[mode]) for mode in (True, False))
    return {
        "steps": steps,
        "block": block,
        "dose": dose,
        "on_s": on,
        "off_s": off,
        "cost_pct": 100 * (on - off) / off / dose,
        "se_pct": 100 * (on_se**2 + off_se**2) ** 0.5 / off / dose,
        "tap_cpu_ms": 1e3 * taps[0].cpu_s / len(times[True]) / dose,
    }


def _fmt(v, digits=3) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder of the trained runs")
    parser.add_argument("--seeds", default="0,1,2", help="seeds of the collapse preset [0,1,2]")
    parser.add_argument("--steps", type=int, default=250, help="steps of the pg_is runs [250]")
    parser.add_argument("--dppo-steps", type=int, default=100, help="steps of the dppo_binary_tv runs [100]")
    parser.add_argument("--cost-steps", type=int, default=1000, help="steps of the cost run [1000]")
    parser.add_argument("--cost-block", type=int, default=1, help="steps judged, then not, in turn [1]")
    parser.add_argument(
        "--cost-doses", default="1", help="monitors judging each judged step, one cost run per value [1]"
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs trained at a time [2]")
    parser.add_argument("--parts", default="online,stop,cost", help="what to measure [online,stop,cost]")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    parts = set(args.parts.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = []
    if "online" in parts or "stop" in parts:
        for seed in seeds:
            if seed != SHIPPED_SEED:
                jobs.append((f"pg_is-seed{seed}", "pg_is", seed, args.steps, "never", args.out / f"pg_is-seed{seed}"))
    if "online" in parts:
        for seed in seeds:
            if seed != SHIPPED_SEED:
                name = f"dppo_binary_tv-seed{seed}"
                jobs.append((name, "dppo_binary_tv", seed, args.dppo_steps, "never", args.out / name))
    if "stop" in parts:
        for seed in seeds:
            name = f"pg_is-stop-seed{seed}"
            jobs.append((name, "pg_is", seed, args.steps, "critical", args.out / name))
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        trained = {r["name"]: r for r in pool.map(train_live, jobs)}
    if "online" in parts:
        rows = [replay_row(f"shipped {p.name} (replay)", p) for p in sorted(SHIPPED.iterdir()) if p.is_dir()]
        rows += [live_row(n, r["path"], r["latency"]) for n, r in trained.items() if "-stop-" not in n]
        print("### Online = offline\n")
        print(table(rows, ["run", "equal", "first_critical", "latency_s", "step_s"]))
    if "stop" in parts:
        rows = []
        for seed in seeds:
            full = SHIPPED / "pg_is" if seed == SHIPPED_SEED else args.out / f"pg_is-seed{seed}"
            rows.append(stop_row(seed, args.out / f"pg_is-stop-seed{seed}", full))
        print("\n### Stopping (pg_is, collapse preset, --stop-on critical)\n")
        cols = [
            "seed",
            "alert",
            "stopped_at",
            "kept_step",
            "kept_acc",
            "final_step",
            "final_acc",
            "best_step",
            "best_acc",
        ]
        print(table(rows, cols))
    if "cost" in parts:
        rows = [cost_row(args.out, args.cost_steps, args.cost_block, int(d)) for d in args.cost_doses.split(",")]
        print("\n### Cost (default preset, 1 thread: s/step with the monitor judging the step before or not)\n")
        print(table(rows, ["steps", "block", "dose", "on_s", "off_s", "cost_pct", "se_pct", "tap_cpu_ms"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
