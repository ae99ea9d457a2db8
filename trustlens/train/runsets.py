"""The commands that train a set of runs: `trustlens compare` (rules × seeds, a table of mean ±
SE per rule) and `trustlens claims` (the paper's claims C1–C6 measured over those runs)."""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, replace
from pathlib import Path

from trustlens.train.config import TrainConfig
from trustlens.train.runner import check_out, config, finish, given, is_main, run_one


def compare(
    rules: list[str],
    seeds: list[int],
    out: Path,
    base,
    *,
    overwrite: bool = False,
    quiet: bool = False,
    reuse: bool = False,
    jobs: int = 1,
) -> dict[str, Path]:
    """Train `base` under each rule and seed, same settings otherwise: {run name: run directory}.
    With `reuse`, a finished run already at its directory with the same settings is kept. `jobs`
    runs are trained at a time, each in a fresh Python process of its own (no progress bars
    then); under torchrun every run uses all the ranks, one after another."""
    configs = {
        (rule if len(seeds) == 1 else f"{rule}-seed{seed}"): replace(base, rule=rule, seed=seed)
        for seed in seeds
        for rule in rules
    }
    return train_runs(configs, out, overwrite=overwrite, quiet=quiet, reuse=reuse, jobs=jobs)


def train_runs(
    configs: dict, out: Path, *, overwrite: bool = False, quiet: bool = False, reuse: bool = False, jobs: int = 1
) -> dict[str, Path]:
    """Train each {run name: TrainConfig} of `configs` into OUT/<name>: {run name: run directory}
    (`compare`'s options)."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer ≥ 1, got {jobs!r}")
    if jobs > 1 and "RANK" in os.environ:
        raise ValueError("jobs > 1 trains runs in processes of their own; under torchrun every run uses all ranks")
    # every config and directory is checked before the first run starts
    runs = {name: out / name for name in configs}
    kept = {name for name, cfg in configs.items() if reuse and _finished_with(runs[name], cfg)}
    if is_main():
        for name, path in runs.items():
            if name not in kept:
                check_out(path, overwrite)
    if is_main():
        for name in kept:
            print(f"keeping the finished run {runs[name]}")
    todo = [(cfg, runs[name]) for name, cfg in configs.items() if name not in kept]
    if jobs == 1:
        for cfg, path in todo:
            run_one(cfg, path, overwrite=overwrite, quiet=quiet)
        return runs
    _train_in_processes(todo, overwrite, jobs)
    return runs


def _train_in_processes(todo: list, overwrite: bool, jobs: int) -> None:
    """Train each (config, directory) of `todo` in a fresh Python process of its own (`run_one`,
    no progress bar), `jobs` at a time. A failed run stops the others and raises."""
    import json
    import subprocess
    import sys
    import time

    code = "import sys; from trustlens.train.runsets import _run_from_json; _run_from_json(sys.argv[1])"
    waiting = list(todo)
    running: list[tuple[Path, subprocess.Popen]] = []
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                cfg, path = waiting.pop(0)
                payload = json.dumps({"config": asdict(cfg), "out": str(path), "overwrite": overwrite})
                running.append((path, subprocess.Popen([sys.executable, "-c", code, payload])))
            time.sleep(0.2)
            for path, proc in list(running):
                if proc.poll() is None:
                    continue
                running.remove((path, proc))
                if proc.returncode != 0:
                    raise RuntimeError(
                        f"training the run {path} failed (exit code {proc.returncode}; its error is above)"
                    )
    finally:
        for _, proc in running:
            proc.terminate()
            proc.wait()


def _run_from_json(payload: str) -> None:
    """The entry point of a process of `_train_in_processes`: `run_one` of the given settings."""
    import json

    given = json.loads(payload)
    run_one(TrainConfig(**given["config"]), Path(given["out"]), overwrite=given["overwrite"], quiet=True)


def _finished_with(path: Path, cfg) -> bool:
    """Whether `path` holds a finished run trained with exactly the settings `cfg`."""
    import json

    try:
        manifest = json.loads((path / "run.json").read_text())
    except (OSError, ValueError):
        return False
    return manifest.get("status") == "finished" and manifest.get("config") == asdict(cfg)


def compare_table(runs: list, out: Path):
    """The outcomes of `runs` (loaded Runs) and their seed table (trustlens.analysis.seeds):
    the table printed and saved as OUT/compare.csv, the outcomes as OUT/compare_runs.csv.
    Returns (table, outcomes)."""
    from trustlens.analysis.seed_text import format_seed_table
    from trustlens.analysis.seeds import run_outcomes, seed_table
    from trustlens.core.render import csv_safe

    outcomes = run_outcomes(runs)
    table = seed_table(outcomes)
    print(format_seed_table(table))
    out.mkdir(parents=True, exist_ok=True)
    csv_safe(table).write_csv(out / "compare.csv")
    csv_safe(outcomes).write_csv(out / "compare_runs.csv")
    print(f"mean ± standard error over seeds; table saved to {out / 'compare.csv'} (per run: compare_runs.csv)")
    return table, outcomes


def _train_runs(args: argparse.Namespace) -> dict[str, Path]:
    """`compare` with the command line's rules, seeds, settings and options."""
    try:
        return compare(
            args.rules,
            args.seeds,
            args.out,
            config(args, seed=args.seeds[0]),
            overwrite=args.overwrite,
            quiet=args.quiet,
            reuse=args.reuse,
            jobs=args.jobs,
        )
    finally:
        finish()


def compare_command(args: argparse.Namespace) -> int:
    runs = _train_runs(args)
    if is_main():
        from trustlens.run import load_run

        compare_table([load_run(p) for p in runs.values()], args.out)
        print(f"runs in {args.out}/; open them with trustlens.load_runs or `trustlens dashboard {args.out}`")
    return 0


# the rules the claims need: C1/C2 ppo vs dppo, C3/C6 no trust region, C4 the π_old anchor, C5 Top-K
CLAIM_RULES = ("ppo", "dppo_binary_tv", "dppo_topk_tv", "dppo_binary_tv_recompute", "pg_is", "cispo")


def claims_command(args: argparse.Namespace) -> int:
    from trustlens.run import load_run

    # --preset or a training flag given with --no-train chooses the set of runs to measure
    chosen = args.preset is not None or any(v is not None for v in given(args).values())
    args.preset = args.preset or "collapse"
    trained = None if args.no_train else _train_runs(args)
    if not is_main():
        return 0
    if trained is None:
        runs, left_out = runs_sharing_settings(args.out, config(args, seed=0) if chosen else None)
    else:
        runs, left_out = [load_run(p) for p in trained.values()], []
    table, outcomes = compare_table(runs, args.out)
    report = write_claims_report(runs, args.out, table, outcomes, left_out=left_out)
    print(f"claims report: {report}")
    return 0


def runs_sharing_settings(folder: Path, want: TrainConfig | None = None) -> tuple[list, list[str]]:
    """What `trustlens claims --no-train` measures: the set of the finished runs directly inside
    `folder` that share their settings apart from rule and seed (`settings_key`), loaded, and a
    line for each run left out (not finished, or which of its settings differ), printed. The set
    is the one trained with the settings of `want` (its rule and seed aside), or, without
    `want`, the largest. Raises ValueError when no set has the settings of `want`, when two sets
    are the largest, or when two of the measured runs share a rule and a seed
    (`check_distinct_seeds`, naming both folders)."""
    import json

    from trustlens.analysis.seeds import check_distinct_seeds, rule_and_seed, settings, settings_key
    from trustlens.run import load_run

    groups: dict[str, list] = {}
    left_out = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if not (path / "run.json").is_file():
            continue
        try:
            status = json.loads((path / "run.json").read_text()).get("status")
        except (OSError, ValueError):
            status = "unreadable"
        if status == "finished":
            run = load_run(path)
            groups.setdefault(settings_key(run), []).append(run)
        else:
            left_out.append(f"{path.name}: not finished (run.json status {status})")
    if not groups:
        raise ValueError(f"--out {folder} holds no finished runs to measure")
    listed = "; ".join(f"{', '.join(r.name for r in g)} ({preset_of(g[0])})" for g in groups.values())
    if want is not None:
        wanted = {k: v for k, v in asdict(want).items() if k not in ("rule", "seed")}
        matching = [g for g in groups.values() if not _differing_on(settings(g[0]), wanted)]
        if not matching:
            raise ValueError(
                f"--out {folder} holds no finished runs with the settings asked for "
                f"({describe_settings(wanted)}); it holds {listed}"
            )
        measured = matching[0]
    else:
        sizes = sorted((len(g) for g in groups.values()), reverse=True)
        if len(sizes) > 1 and sizes[0] == sizes[1]:
            raise ValueError(
                f"--out {folder} holds equally large sets of runs with different settings: {listed}; "
                "move the runs to measure into a folder of their own"
            )
        measured = max(groups.values(), key=len)
    check_distinct_seeds((str(r.path), *rule_and_seed(r)) for r in measured)
    ours = settings(measured[0])
    for run in (r for g in groups.values() if g is not measured for r in g):
        theirs = settings(run)
        keys = _differing(theirs, ours)
        rule, seed = rule_and_seed(run)
        left_out.append(
            f"{run.name} ({rule}, seed {seed}; {preset_of(run)}): {_listed(theirs, keys)}; the measured runs "
            f"have {_listed(ours, keys)}"
        )
    n = len(measured)
    which = (
        "the set with the settings asked for"
        if want
        else "the largest set sharing their settings apart from rule and seed"
    )
    print(f"measuring {n} run{'s' if n != 1 else ''} in {folder} ({preset_of(measured[0])}), {which}")
    if left_out:
        print("left out:\n" + "\n".join(f"  {line}" for line in left_out))
    return measured, left_out


def preset_of(run) -> str:
    """How the settings of `run` read (`describe_settings`)."""
    from trustlens.analysis.seeds import settings

    return describe_settings(settings(run))


def describe_settings(values: dict) -> str:
    """How the settings `values` (a TrainConfig's fields but rule and seed) read: "preset
    `collapse`", with the settings that differ from the nearest preset ("preset `default` with
    keep_rate=0.03"), or that they were not those of `trustlens train`."""
    from trustlens.train.config import PRESETS, field_defaults

    defaults = field_defaults()
    if not values or not set(values) <= set(defaults):
        return "not trained by `trustlens train`"
    differ = {name: _differing_on(values, {**defaults, **PRESETS[name]}) for name in PRESETS}
    nearest = min(PRESETS, key=lambda name: len(differ[name]))
    return f"preset `{nearest}`" + (f" with {_listed(values, differ[nearest])}" if differ[nearest] else "")


def _differing_on(recorded: dict, other: dict) -> list[str]:
    """The settings a run `recorded` whose values differ in `other`, sorted: over the recorded
    ones only, as a run of an older trustlens may lack the newer settings."""
    return _differing(recorded, {k: other.get(k) for k in recorded})


def _differing(given: dict, other: dict) -> list[str]:
    """The settings of `given` (or of `other`) whose values differ between the two, sorted."""
    return sorted(k for k in set(given) | set(other) if given.get(k) != other.get(k))


def _listed(settings: dict, keys: list[str]) -> str:
    return ", ".join(f"{k}={settings.get(k)}" for k in keys)


def write_claims_report(runs, out: Path, table, outcomes, *, left_out: list[str]) -> Path:
    """Measure C1–C6 on `runs` (of one set of settings apart from rule and seed), write
    OUT/figures/C*.html and OUT/claims.md (`table` and `outcomes` from `compare_table`, the
    runs `left_out` listed); the report's path."""
    from trustlens.analysis.claims import alert_leads, measure_claims, outcome_rows
    from trustlens.analysis.seed_text import format_seed_table

    claims = measure_claims(runs, outcomes)
    figures = out / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    lines = [
        "# The DPPO paper's claims, measured at this scale",
        "",
        f"{len(runs)} runs in `{out}` ({preset_of(runs[0])}), written by `trustlens claims`. "
        "Mean ± standard error (sample sd / √n) over seeds.",
        "",
    ]
    if left_out:
        lines += ["Left out (not finished, or other settings):", "", *(f"- {line}" for line in left_out), ""]
    for c in claims:
        print(c.line())
        lines += [f"## {c.key}: {c.title}", "", f"**{c.verdict}** — {c.evidence}", ""]
        if c.figure is not None:
            path = figures / f"{c.key}.html"
            c.figure.write_html(path, include_plotlyjs="cdn")
            lines += [f"Figure: [{path.name}](figures/{path.name})", ""]
    leads = alert_leads(outcomes)
    print("alerts: " + leads)
    lines += ["## Collapse alerts", "", leads, "", "## Per rule", "", "```", format_seed_table(table), "```", ""]
    lines += ["## Per run", "", *outcome_rows(outcomes), ""]
    report = out / "claims.md"
    report.write_text("\n".join(lines))
    return report
