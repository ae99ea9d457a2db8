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
a critical alert.
`--config` overrides a `CollapseConfig` field (e.g. `--config reward_drop=0.3`) to try a
threshold on the same runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from pathlib import Path

import polars as pl

from trustlens.analysis.claims import alert_leads
from trustlens.analysis.collapse import CollapseConfig, collapse_onset, collapse_window, detect_collapse
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


def _alert_text(a: dict) -> str:
    span = f"{a['step']}" if a["step"] == a["end_step"] else f"{a['step']}–{a['end_step']}"
    signal = "" if a["signal"] in ("entropy", "k3_kl", "reward", "grad_norm") else f"[{a['signal']}]"
    severity = "warning" if a["critical_step"] is None else f"critical from {a['critical_step']}"
    return f"{a['kind']}{signal} @{span} {severity}"


def print_run(row: dict) -> None:
    collapse = (
        "no collapse" if row["collapse_step"] is None else f"collapse @{row['collapse_step']} ({row['collapse_cause']})"
    )
    lead = "" if row["lead"] is None else f", lead {row['lead']}"
    print(f"  {row['run']:<32} {row['rule'] or '?':<26} {row['steps']:>4} steps  {collapse}{lead}")
    for a in row["alerts"]:
        print(f"      {_alert_text(a)}")


def summary(rows: list[dict]) -> str:
    outcomes = pl.DataFrame(
        [{k: r[k] for k in ("collapse_step", "first_critical", "lead")} for r in rows],
        schema={"collapse_step": pl.Int64, "first_critical": pl.Int64, "lead": pl.Int64},
    )
    return alert_leads(outcomes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sets", nargs="+", metavar="NAME=FOLDER")
    parser.add_argument("--config", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--quiet", action="store_true", help="the summary lines only")
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
        every += rows
        if not args.quiet:
            print(f"== {name}: {len(rows)} runs")
            for row in rows:
                print_run(row)
        print(f"{name}: {summary(rows)}")
    print(f"all: {summary(every)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
