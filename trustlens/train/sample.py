"""The shipped sample runs and the demo beside them: `trustlens make-sample`, which regenerates
data/sample_run, and `trustlens demo`, the default run opened in the dashboard with the sample."""

from __future__ import annotations

import argparse
import shutil
import urllib.parse
from dataclasses import replace
from pathlib import Path

from trustlens.train.config import TrainConfig, config_from_preset
from trustlens.train.runner import config, finish, given, is_main, print_inspect, run_one
from trustlens.train.runsets import train_runs

# the demo's seed when --seed is not given: the shipped learning run has the default preset's
# seed 0, so the demo trains a run the sample does not have
DEMO_SEED = 1
# the shipped runs the demo opens beside its own: a collapse and a stable DPPO run
DEMO_BESIDE = ("pg_is", "dppo_binary_tv")


def demo_command(args: argparse.Namespace) -> int:
    cfg = config(args, rule=args.rule, **({"seed": DEMO_SEED} if getattr(args, "seed", None) is None else {}))
    out = args.out or Path("runs") / "demo"
    launch = None if args.no_dashboard else _dashboard_launcher()
    if launch is not None and is_main():
        from trustlens.dashboard import check_port_free

        check_port_free(args.port)  # before the training, not after it
    try:
        run_one(cfg, out, overwrite=args.overwrite or args.out is None, quiet=args.quiet)
    finally:
        finish()
    if not is_main():
        return 0
    if launch is None:
        print_inspect(out)
        return 0
    shown = _beside_sample(out)
    print(
        f"the dashboard serves {shown}: the demo run {out.name!r} beside the shipped collapse (pg_is) and a "
        f"stable DPPO run (dppo_binary_tv) on one screen at\n  {demo_view(out.name, args.port)}",
        flush=True,
    )
    return int(launch(str(shown), port=args.port) or 0)


def demo_view(name: str, port: int, host: str = "127.0.0.1") -> str:
    """The address of the dashboard's Compare runs page with the demo run `name` beside the
    shipped DEMO_BESIDE runs (copied into sample_run/ next to it)."""
    runs = [name, *(f"sample_run/{r}" for r in DEMO_BESIDE)]
    query = urllib.parse.urlencode([("run", name), *(("compare", r) for r in runs)])
    return f"http://{host}:{port}/compare?{query}"


def _beside_sample(out: Path) -> Path:
    """Copy the shipped sample runs (a collapse beside a stable DPPO run) next to the demo run,
    into OUT/../sample_run (replacing an earlier copy), and return the folder holding both."""
    folder = out.resolve().parent
    source, copy = default_sample_dir(), folder / "sample_run"
    ours = not copy.exists() or all((child / "run.json").is_file() for child in copy.iterdir())
    if source.is_dir() and source.resolve() != copy.resolve() and ours:  # never replace a folder of other files
        if copy.exists():
            shutil.rmtree(copy)
        shutil.copytree(source, copy)
    return folder


def _dashboard_launcher():
    """`trustlens.dashboard.launch` when the dashboard is installed, else None."""
    try:
        from trustlens.dashboard import launch
    except ImportError:
        return None
    return launch


def default_sample_dir() -> Path:
    from trustlens.paths import data_path

    return data_path("sample_run")


# the sample run that shows learning: the default preset's run, recorded as the sample preset's
SAMPLE_LEARNING = "learning"


def sample_configs(rules: list[str], **overrides) -> dict[str, TrainConfig]:
    """The runs of the shipped sample, {name: settings}: each rule under the sample preset (a
    collapse beside rules that do not collapse), named for its rule, and SAMPLE_LEARNING, the
    default preset's dppo_binary_tv run (what the demo trains: it learns), recorded with the
    sample's keep_rate. `overrides` (None: not given) apply to all of them."""
    base = config_from_preset("sample", **overrides)
    learning = config_from_preset("default", **{**overrides, "rule": "dppo_binary_tv", "keep_rate": base.keep_rate})
    return {**{rule: replace(base, rule=rule) for rule in rules}, SAMPLE_LEARNING: learning}


def make_sample_command(args: argparse.Namespace) -> int:
    out = args.out or default_sample_dir()
    configs = sample_configs(args.rules, **given(args))
    try:
        train_runs(configs, out, overwrite=True, quiet=args.quiet, reuse=args.reuse, jobs=args.jobs)
    finally:
        finish()
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"sample runs ({', '.join(configs)}) written to {out}, {size / 1e6:.1f} MB")
    return 0
