"""The collapse alerts on long runs, old detectors against new, per run: false alarms per 1,000
healthy steps, recall, lead, episodes after the collapse, and the accuracy a stop would keep.

    python benchmarks/alert_bench.py make  CACHE [--synthetic-steps N] [--builtin] [--builtin-steps N] [--seeds K]
    python benchmarks/alert_bench.py table CACHE [--old-tree DIR]

`make` writes the runs that are not in CACHE yet (CACHE/runs/NAME, each a recorded run):
    synthetic  `trustlens.synthetic` runs of N steps (default 10,000) with the healthy drift of a
               long run (`Drift`: 50-step warm-up, entropy −40 %, grad norm ×0.5, k3 mismatch ×2,
               an evaluation every 25 steps of 256 problems): healthy seeds 0–1 and seeds 0–1
               collapsing at 70 % of the run
    builtin    (--builtin) the built-in trainer: healthy runs of N steps (default 1,500) of the
               default, fp8 and stale presets × rules dppo_binary_tv and ppo × warm-up 0 and 100
               steps; the collapse and late_collapse presets with rule pg_is on K seeds (default 3)
Runs already in CACHE are kept (a run is its folder: delete it to make it again), so `make` can
be stopped and resumed, and other recorded runs may be put in CACHE/runs by hand (the shipped
data/sample_run runs are, by `make`, as "shipped-*").

`table` prints one row per run and detector set from the finished runs in CACHE: the new detectors
(this tree) and, with --old-tree (a checkout of main bea0ccc's trustlens/), the old ones, run in
a subprocess on the same runs and cached in CACHE/old.json (per run id and last update). The
collapse is collapse_onset's (held-out accuracy below half the first evaluation, or the reward
below half its first window's), or where it finds none the first evaluation below half the best
one before it (a run that learned from a low start).
Columns:
    healthy    steps before the collapse (the whole run without one) past the warm-up
    crit/1k    false critical alerts per 1,000 healthy steps: on a run that did not collapse, or
               more than HORIZON (500) steps before the collapse
    warn/1k    warning episodes that opened on healthy steps, per 1,000 of them
    info/1k    info episodes, the same
    warned     a critical alert 1–500 steps before the collapse (collapsing runs)
    lead       collapse step − the first critical step
    after      alert episodes that opened after the collapse
    kept/best  held-out accuracy of the last evaluation before the first critical alert's
               evidence began (the checkpoint a stop keeps), against the run's best evaluation
and, per detector set, the totals against the goals of docs/alerts.md.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEALTHY_PRESETS = ("default", "fp8", "stale")
HEALTHY_RULES = ("dppo_binary_tv", "ppo")
WARMUPS = (0, 100)
COLLAPSE_PRESETS = ("collapse", "late_collapse")


def synthetic_specs(steps: int) -> dict[str, dict]:
    """name -> write_synthetic_run arguments of the synthetic runs."""
    specs = {}
    for seed in (0, 1):
        specs[f"synthetic-healthy-s{seed}"] = {"seed": seed, "collapse_at": None}
        specs[f"synthetic-collapse-s{seed}"] = {"seed": seed, "collapse_at": int(0.7 * steps)}
    return specs


def builtin_specs(steps: int, seeds: int) -> dict[str, dict]:
    """name -> train_main flags of the built-in runs."""
    specs = {}
    for preset in HEALTHY_PRESETS:
        for rule in HEALTHY_RULES:
            for warmup in WARMUPS:
                specs[f"{preset}-{rule}-w{warmup}"] = {
                    "preset": preset,
                    "rule": rule,
                    "steps": steps,
                    "warmup-steps": warmup,
                    "eval-every": 25,
                }
    for preset in COLLAPSE_PRESETS:
        for seed in range(seeds):
            specs[f"{preset}-pg_is-s{seed}"] = {"preset": preset, "rule": "pg_is", "seed": seed}
    return specs


def make(cache: Path, synthetic_steps: int, builtin: bool, builtin_steps: int, seeds: int) -> None:
    from trustlens.synthetic import Drift, write_synthetic_run

    runs = cache / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for sample in sorted((REPO / "data" / "sample_run").iterdir()):
        target = runs / f"shipped-{sample.name}"
        if sample.is_dir() and not target.exists():
            target.symlink_to(sample.resolve())
    for name, spec in synthetic_specs(synthetic_steps).items():
        if not (runs / name).exists():
            print(f"writing {name} ({synthetic_steps} steps)", flush=True)
            write_synthetic_run(
                runs / name,
                steps=synthetic_steps,
                samples_per_step=16,
                seq_len=8,
                rules=["ppo", "dppo_binary_tv"],
                active_rule="ppo",
                drift=Drift(),
                **spec,
            )
    if not builtin:
        return
    for name, spec in builtin_specs(builtin_steps, seeds).items():
        if (runs / name).exists():
            continue
        flags = [f"--{k}={v}" for k, v in spec.items()]
        print(f"training {name}: {' '.join(flags)}", flush=True)
        cmd = [sys.executable, "-m", "trustlens.cli", "train", *flags, "--out", str(runs / name)]
        subprocess.run(cmd, check=True, cwd=REPO)


# the script the old tree runs: each run's alerts as JSON (kind, step, end_step, severity, critical_step)
_OLD = """
import json, sys, warnings
warnings.simplefilter("ignore")
from trustlens import load_run
from trustlens.analysis import detect_collapse
out = {}
for path in sys.argv[1:]:
    a = detect_collapse(load_run(path))
    out[path] = [dict(r, evidence_start_step=r["step"]) for r in a.select(
        "kind", "step", "end_step", "severity", "critical_step").to_dicts()]
print(json.dumps(out))
"""


def identity(path: Path) -> str:
    """The key of a run's cached old alerts: its path, run id and last update (run.json), so that a
    run made again in the same folder is not read from the cache."""
    manifest = json.loads((path / "run.json").read_text())
    return f"{path}#{manifest.get('run_id')}@{manifest.get('updated')}"


def old_alerts(cache: Path, paths: list[Path], tree: Path) -> dict[str, list[dict]]:
    """The old detectors' alerts of `paths`, from CACHE/old.json or a subprocess on `tree`."""
    stored = cache / "old.json"
    known = json.loads(stored.read_text()) if stored.exists() else {}
    keys = {str(p): identity(p) for p in paths}
    missing = [p for p, key in keys.items() if key not in known]
    if missing:
        env = {"PYTHONPATH": str(tree), "PATH": str(Path(sys.executable).parent)}
        # run from the old tree: `python -c` puts the working folder first on sys.path
        done = subprocess.run([sys.executable, "-c", _OLD, *missing], capture_output=True, text=True, env=env, cwd=tree)
        if done.returncode:
            raise SystemExit(f"the old tree {tree} failed: {done.stderr.strip().splitlines()[-1:]}")
        known |= {keys[p]: alerts for p, alerts in json.loads(done.stdout).items()}
        stored.write_text(json.dumps(known))
    return {p: known[key] for p, key in keys.items()}


def new_alerts(path: Path) -> list[dict]:
    from trustlens.analysis import detect_collapse
    from trustlens.run import load_run

    alerts = detect_collapse(load_run(path))
    return alerts.select("kind", "step", "end_step", "severity", "critical_step", "evidence_start_step").to_dicts()


def after_peak(accuracy: list[tuple[int, float]]) -> int | None:
    """The first evaluation below half the best one before it: the collapse of a run that learned
    from a first evaluation too low for collapse_onset's half of it."""
    best = -math.inf
    for step, a in accuracy:
        if a < 0.5 * best:
            return step
        best = max(best, a)
    return None


def outcome(path: Path) -> dict:
    """The run's steps, warm-up, collapse (collapse_onset; where it finds none, `after_peak`) and
    evaluations."""
    from trustlens.analysis.collapse import accuracy_per_step, collapse_onset, collapse_window, reward_per_step
    from trustlens.analysis.collapse.steps import warmup_steps
    from trustlens.run import load_run

    run = load_run(path)
    reward = reward_per_step(run)
    accuracy = accuracy_per_step(run)
    onset, _ = collapse_onset(accuracy, reward, collapse_window(len(reward)))
    if onset is None:
        onset = after_peak(accuracy)
    return {"steps": len(reward), "warmup": warmup_steps(run.manifest), "onset": onset, "evals": accuracy}


# a critical alert at most this many steps before the collapse warned of it; an earlier one is a
# false alarm on healthy steps
HORIZON = 500


def scores(alerts: list[dict], run: dict) -> dict:
    """The table's columns of one run's alerts (module docstring)."""
    onset, warmup = run["onset"], run["warmup"]
    end = run["steps"] if onset is None else onset
    healthy = max(0, end - warmup)
    per_k = 1000 / healthy if healthy else math.nan
    before = [a for a in alerts if onset is None or a["step"] < onset]
    critical = [a for a in alerts if a["critical_step"] is not None]
    false = [a for a in critical if onset is None or a["critical_step"] < onset - HORIZON]
    first = min((a["critical_step"] for a in critical if a not in false), default=None)
    row = {
        "healthy": healthy,
        "crit/1k": len(false) * per_k,
        "warn/1k": sum(a["severity"] == "warning" for a in before) * per_k,
        "info/1k": sum(a["severity"] == "info" for a in before) * per_k,
        "warned": None if onset is None else first is not None and first < onset,
        "lead": None if onset is None or first is None else onset - first,
        "after": None if onset is None else sum(a["step"] > onset for a in alerts),
        "kept/best": None,
    }
    if first is not None and run["evals"]:
        evidence = min(a["evidence_start_step"] for a in critical if a["critical_step"] == first and a not in false)
        kept = [acc for step, acc in run["evals"] if step < evidence]
        best = max(acc for _, acc in run["evals"])
        row["kept/best"] = f"{kept[-1]:.2f}/{best:.2f}" if kept else f"–/{best:.2f}"
    return row


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return "–" if math.isnan(v) else f"{v:.2f}"
    return str(v)


COLUMNS = ("healthy", "crit/1k", "warn/1k", "info/1k", "warned", "lead", "after", "kept/best")


def finished_runs(cache: Path) -> list[Path]:
    """The runs of CACHE/runs, less those still being written (run.json status `running`: a
    training that has not ended), which are named on stderr."""
    runs = []
    for path in sorted(p for p in (cache / "runs").iterdir() if (p / "run.json").exists()):
        if json.loads((path / "run.json").read_text()).get("status") == "running":
            print(f"skipping {path.name}: still being written", file=sys.stderr)
        else:
            runs.append(path)
    return runs


def table(cache: Path, tree: Path | None) -> str:
    runs = finished_runs(cache)
    sets = {"new": {str(p): new_alerts(p) for p in runs}}
    if tree is not None:
        sets = {"old": old_alerts(cache, runs, tree), **sets}
    outcomes = {str(p): outcome(p) for p in runs}
    lines = ["| run | steps | collapse | detectors | " + " | ".join(COLUMNS) + " |"]
    lines.append("|" + "---|" * (4 + len(COLUMNS)))
    totals: dict[str, dict] = {}
    for p in runs:
        o = outcomes[str(p)]
        for name, alerts in sets.items():
            row = scores(alerts[str(p)], o)
            t = totals.setdefault(name, {"healthy": 0, "crit": 0, "warn": 0, "info": 0, "leads": [], "after": []})
            t["healthy"] += row["healthy"]
            k = row["healthy"] / 1000
            if row["healthy"]:  # a run that collapsed during its warm-up has no healthy step to count
                t["crit"] += round(row["crit/1k"] * k)
                t["warn"] += round(row["warn/1k"] * k)
                t["info"] += round(row["info/1k"] * k)
            if o["onset"] is not None:
                t.setdefault("collapses", 0)
                t["collapses"] += 1
                t.setdefault("warned", 0)
                t["warned"] += bool(row["warned"])
                t["after"].append(row["after"])
                if row["lead"] is not None and row["warned"]:
                    t["leads"].append(row["lead"])
            collapse = "" if o["onset"] is None else str(o["onset"])
            cells = " | ".join(_cell(row[c]) for c in COLUMNS)
            lines.append(f"| {p.name} | {o['steps']} | {collapse} | {name} | {cells} |")
    lines.append("")
    for name, t in totals.items():
        per = 1000 / t["healthy"] if t["healthy"] else math.nan
        leads = sorted(t["leads"])
        median = leads[len(leads) // 2] if leads else None
        after = sorted(t["after"])
        lines.append(
            f"{name}: {t['healthy']} healthy steps: {t['crit'] * per:.2f} critical, {t['warn'] * per:.2f} warning "
            f"and {t['info'] * per:.2f} info episodes per 1,000; critical before {t.get('warned', 0)}/"
            f"{t.get('collapses', 0)} collapses, median lead {median}, episodes after the collapse "
            f"{after[len(after) // 2] if after else None} (median), {max(after) if after else None} (most)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make", help="write the runs missing from CACHE")
    m.add_argument("cache", type=Path)
    m.add_argument("--synthetic-steps", type=int, default=10_000)
    m.add_argument("--builtin", action="store_true", help="also train the built-in runs (hours on 2 cores)")
    m.add_argument("--builtin-steps", type=int, default=1500)
    m.add_argument("--seeds", type=int, default=3)
    t = sub.add_parser("table", help="the table of the runs in CACHE")
    t.add_argument("cache", type=Path)
    t.add_argument("--old-tree", type=Path, help="a checkout of main bea0ccc (its trustlens/ folder's parent)")
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if args.command == "make":
            make(args.cache, args.synthetic_steps, args.builtin, args.builtin_steps, args.seeds)
        else:
            print(table(args.cache, args.old_tree))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
