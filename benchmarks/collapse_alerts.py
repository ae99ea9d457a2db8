"""Collapse alerts against collapses, over sets of recorded runs: does every collapsing run get a
critical alert before it collapses, and does no other run get one?

    python benchmarks/collapse_alerts.py NAME=FOLDER [NAME=FOLDER ...] [--config FIELD=VALUE ...] [--quiet]

e.g. `python benchmarks/collapse_alerts.py claims=/work/exp/claims exploration=/work/exp
sample=data/sample_run`. Each set holds the finished runs at or below its folder; a run below
two folders belongs to the deeper one (so `exploration` above leaves out the claims runs).
Per run: the active rule, the steps, the collapse (`collapse_onset`: the first evaluation below
half the first one's accuracy, or the reward collapse, whichever comes first) and every alert of
`detect_collapse` (detector, watched signal, steps, and the step it became critical at), then
the first critical step and the lead = collapse step − first critical step. Per set, and over
all sets, the line `trustlens claims` reports (`alert_leads`): collapsing runs with a critical
alert at least one step before the collapse, their leads, and runs that did not collapse but had
a critical alert; and the runs that did not collapse but had any warning or critical alert
(entropy alerts while the run learns are "info", left out).
`--config` overrides a `CollapseConfig` field (e.g. `--config reward_drop=0.3`) to try a
threshold on the same runs.

`--signals` adds, per run, how far each signal of `step_signals` moved from its early baseline
m (the median of the first alert_window(steps) steps) after the baseline and before the
collapse (the whole run without one), as the alerts see it: the extremes of x̄/m, x̄ the median
of the 3 steps ending at a step (grad_norm: the step's own value), and the lowest r̄/m, r̄ the
mean reward over the last alert_window(steps) steps; per set, the range of each over the
collapsing runs and over the others. A signal that separates the two moves further in every
collapsing run than in any other.
"""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from pathlib import Path

import polars as pl

from trustlens.analysis.claims import alert_leads
from trustlens.analysis.collapse import CollapseConfig, alert_window, detect_collapse
from trustlens.analysis.collapse.onset import collapse_onset, collapse_window
from trustlens.analysis.collapse.signals import step_signals
from trustlens.analysis.seeds import accuracy_per_step, reward_per_step
from trustlens.run import load_runs


def run_sets(specs: list[str]) -> dict[str, list]:
    """NAME=FOLDER specs → {name: finished runs}, each run in the set of its deepest folder."""
    folders = {}
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            raise SystemExit(f"expected NAME=FOLDER, got {spec!r}")
        folders[name] = Path(folder).resolve()
    sets: dict[str, list] = {name: [] for name in folders}
    seen: dict[Path, tuple[int, str]] = {}
    runs = {}
    for name, folder in folders.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = load_runs(folder)
        for run in found:
            path = Path(run.path).resolve()
            depth = len(folder.parts)
            if run.status == "finished" and (path not in seen or seen[path][0] < depth):
                seen[path], runs[path] = (depth, name), run
    for path, (_, name) in sorted(seen.items()):
        sets[name].append(runs[path])
    return sets


def run_alerts(run, config: CollapseConfig) -> dict:
    """The collapse and the alerts of one run, with the first critical alert and its lead."""
    reward = reward_per_step(run)
    onset, cause = collapse_onset(accuracy_per_step(run), reward, collapse_window(len(reward)))
    alerts = detect_collapse(run, config)
    critical = alerts["critical_step"].drop_nulls().to_list()
    first = min(critical) if critical else None
    return {
        "run": run.name,
        "rule": run.active_rule,
        "steps": len(reward),
        "collapse_step": onset,
        "collapse_cause": cause,
        "first_critical": first,
        "lead": None if onset is None or first is None else onset - first,
        "alerts": alerts.select("kind", "signal", "severity", "step", "end_step", "critical_step").to_dicts(),
    }


# (name, signal column, statistic, extreme) of the --signals table; "blocked" is the active rule's
MOVES = (
    ("k3_max", "k3_kl", "median", "max"),
    ("entropy_min", "entropy", "median", "min"),
    ("entropy_max", "entropy", "median", "max"),
    ("grad_max", "grad_norm", "step", "max"),
    ("blocked_max", "blocked", "median", "max"),
    ("reward_min", "reward", "window", "min"),
)


def signal_moves(run, collapse_step: int | None) -> dict[str, float | None]:
    """The extremes of x̄/m (r̄/m for the reward) of each signal before the collapse (module
    docstring); None where the run lacks the signal or its baseline is 0."""
    signals = step_signals(run)
    n = alert_window(signals.height)
    blocked = f"blocked_{run.active_rule}"
    out: dict[str, float | None] = {}
    for name, column, stat, extreme in MOVES:
        column = blocked if column == "blocked" else column
        if column not in signals.columns:
            out[name] = None
            continue
        x = pl.col(column)
        smoothed = {"median": x.rolling_median(3, min_samples=1), "step": x, "window": x.rolling_mean(n, min_samples=1)}
        df = signals.select("step", x.alias("x"), smoothed[stat].alias("s"))
        m = df["x"].head(n).median()
        after = df.slice(n).filter(pl.col("step") < collapse_step) if collapse_step is not None else df.slice(n)
        value = getattr(after["s"], extreme)() if after.height else None
        out[name] = value / m if value is not None and m else None  # type: ignore[operator]
    return out


def _range(values: list[float | None]) -> str:
    xs = sorted(v for v in values if v is not None)
    return f"{xs[0]:.2f}–{xs[-1]:.2f} (n={len(xs)})" if xs else "–"


def print_moves(rows: list[dict]) -> None:
    for label, part in (
        ("collapsing", [r for r in rows if r["collapse_step"] is not None]),
        ("other", [r for r in rows if r["collapse_step"] is None]),
    ):
        cells = [f"{name} {_range([r['moves'][name] for r in part])}" for name, *_ in MOVES]
        print(f"  signals before the collapse, {label} runs: " + "; ".join(cells))


def _alert_text(a: dict) -> str:
    span = f"{a['step']}" if a["step"] == a["end_step"] else f"{a['step']}–{a['end_step']}"
    signal = "" if a["signal"] in ("entropy", "k3_kl", "reward", "grad_norm") else f"[{a['signal']}]"
    severity = a["severity"] if a["critical_step"] is None else f"critical from {a['critical_step']}"
    return f"{a['kind']}{signal} @{span} {severity}"


def print_run(row: dict) -> None:
    collapse = (
        "no collapse" if row["collapse_step"] is None else f"collapse @{row['collapse_step']} ({row['collapse_cause']})"
    )
    lead = "" if row["lead"] is None else f", lead {row['lead']}"
    print(f"  {row['run']:<32} {row['rule'] or '?':<26} {row['steps']:>4} steps  {collapse}{lead}")
    if "moves" in row:
        print("      x̄/m " + " ".join(f"{k}={'–' if v is None else f'{v:.2f}'}" for k, v in row["moves"].items()))
    for a in row["alerts"]:
        print(f"      {_alert_text(a)}")


def summary(rows: list[dict]) -> str:
    outcomes = pl.DataFrame(
        [{k: r[k] for k in ("collapse_step", "first_critical", "lead")} for r in rows],
        schema={"collapse_step": pl.Int64, "first_critical": pl.Int64, "lead": pl.Int64},
    )
    return alert_leads(outcomes)


def warned(rows: list[dict]) -> str:
    """The runs that did not collapse but had a warning or critical alert (info alerts aside)."""
    calm = [r for r in rows if r["collapse_step"] is None]
    loud = [r["run"] for r in calm if any(a["severity"] != "info" for a in r["alerts"])]
    names = f": {', '.join(loud)}" if loud else ""
    return f"{len(loud)}/{len(calm)} runs that did not collapse had a warning or critical alert{names}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sets", nargs="+", metavar="NAME=FOLDER")
    parser.add_argument("--config", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--quiet", action="store_true", help="the summary lines only")
    parser.add_argument("--signals", action="store_true", help="how far each signal moved before the collapse")
    args = parser.parse_args(argv)
    types = {f.name: f.type for f in dataclasses.fields(CollapseConfig)}
    overrides: dict[str, float | int] = {}
    for item in args.config:
        key, _, value = item.partition("=")
        if key not in types:
            raise SystemExit(f"unknown CollapseConfig field {key!r}")
        overrides[key] = int(value) if "int" in str(types[key]) else float(value)
    config = CollapseConfig(**overrides)  # type: ignore[arg-type]
    every: list[dict] = []
    for name, runs in run_sets(args.sets).items():
        rows = [run_alerts(run, config) for run in runs]
        if args.signals:
            for run, row in zip(runs, rows, strict=True):
                row["moves"] = signal_moves(run, row["collapse_step"])
        every += rows
        if not args.quiet:
            print(f"== {name}: {len(rows)} runs")
            for row in rows:
                print_run(row)
        print(f"{name} (warnings): {warned(rows)}")
        print(f"{name}: {summary(rows)}")
        if args.signals:
            print_moves(rows)
    print(f"all (warnings): {warned(every)}")
    print(f"all: {summary(every)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
