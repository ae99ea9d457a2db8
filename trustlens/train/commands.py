"""The `trustlens train`, `compare`, `demo` and `make-sample` commands.

    trustlens train --rule dppo_binary_tv --steps 60 --out runs/dppo --seed 0
    trustlens compare --rules ppo,dppo_binary_tv,pg_is --steps 60 --out runs/
    trustlens demo                      # the default run, then the dashboard on it
    trustlens make-sample               # regenerate the shipped sample runs, data/sample_run
    trustlens claims --seeds 0,1,2      # the paper's claims C1–C6 measured: runs/claims/claims.md

Data parallel on CPU: `torchrun --nproc_per_node 2 -m trustlens.cli train ...` (gloo); each rank
rolls out its share of the prompts and records its own shard of the run.
"""

from __future__ import annotations

import argparse
import os
import shutil
from dataclasses import fields, replace
from pathlib import Path

from trustlens.train.config import LOSS_AGG_MODES_HELP, PRESETS, TrainConfig, config_from_preset

RULE_HELP = (
    "trust-region rule that gates the updates (docs/rules.md): ppo, ppo_clip_higher, minirl, dppo_binary_tv, "
    "dppo_binary_kl, dppo_topk_tv, dppo_topk_kl, *_recompute, cispo, pg_is, grpo_tis; "
    "the full list is trustlens.rules.RULES [dppo_binary_tv]"
)
# (TrainConfig field, argparse type, help). The flag is --field-name; its default is the preset's.
_CONFIG_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("steps", int, "training steps; each is one rollout batch"),
    ("seed", int, "seed of the problems, the sampling and the minibatch order"),
    ("low", float, "the rule's threshold when A ≤ 0"),
    ("high", float, "the rule's threshold when A > 0"),
    ("tv_bound", float, "δ of every TV-bounded DPPO rule (binary and top-K TV) where --low/--high give none"),
    ("prompts_per_step", int, "problems per step, over all ranks"),
    ("group_size", int, "responses sampled per problem (GRPO group size G)"),
    ("minibatches", int, "optimizer updates per pass over a rollout batch"),
    ("epochs", int, "passes over each rollout batch"),
    ("lr", float, "AdamW learning rate"),
    ("weight_decay", float, "AdamW weight decay"),
    ("grad_clip", float, "max global gradient L2 norm"),
    ("clip_ratio_c", float, "cap C of the importance weight min(π/μ, C)"),
    ("loss_agg_mode", str, "loss aggregation over tokens: " + LOSS_AGG_MODES_HELP),
    ("temperature", float, "sampling temperature τ (μ and π both use logits / τ)"),
    ("max_new_tokens", int, "response length cap in tokens"),
    ("topk", int, "K of μ's recorded top-K distribution"),
    ("rollout_precision", str, "rollout engine precision: bf16, fp32 or fp8 (W8A8 float8)"),
    ("rollout_lag", int, "rollout engine lags the trainer by this many steps (asynchronous RL)"),
    ("logit_noise", float, "std of Gaussian noise on the rollout engine's logits"),
    ("eval_every", int, "evaluate held-out accuracy every this many steps"),
    ("eval_size", int, "held-out problems per evaluation (0 = no evaluation)"),
    ("partial_credit", float, "reward share for right scratchpad steps when the final answer is wrong"),
    ("checkpoint", str, "warm-start checkpoint folder; 'random' starts from a random model"),
    ("threads", int, "torch CPU threads per process"),
    ("sample_every", int, "record prompts and responses every this many steps"),
    (
        "keep_rate",
        float,
        "sampled recording: every token that matters and this share of the rest, with exact aggregates",
    ),
    ("mirror", str, "stream each step's scalars live from rank 0: tensorboard:LOGDIR, wandb or wandb:PROJECT"),
)

# how --help shows the defaults that are not a value of their own
_SHOWN_DEFAULTS = {
    "checkpoint": "the shipped data/warmstart",
    "low": "the rule's own",
    "high": "the rule's own",
    "tv_bound": "each rule's own (0.15)",
    "mirror": "none",
    "keep_rate": "every token",
}


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """Add the flags of command `name` (train, compare, demo or make-sample)."""
    parser.epilog = "presets: " + "; ".join(
        f"{preset} = {', '.join(f'{k}={v}' for k, v in values.items()) or 'the defaults'}"
        for preset, values in PRESETS.items()
    )
    if name == "train":
        parser.add_argument("--rule", default="dppo_binary_tv", help=RULE_HELP)
        parser.add_argument("--out", type=Path, default=None, help="run directory (default: runs/<rule>)")
        parser.set_defaults(func=_train)
    elif name == "compare":
        parser.add_argument(
            "--rules",
            type=_rule_list,
            default="ppo,dppo_binary_tv,pg_is",
            help="comma-separated rules, each trained into its own run [ppo,dppo_binary_tv,pg_is]",
        )
        parser.add_argument(
            "--seeds",
            type=_int_list,
            default="0",
            help="comma-separated seeds; several give OUT/<rule>-seed<S> runs [0]",
        )
        parser.add_argument(
            "--out",
            type=Path,
            default=Path("runs"),
            help="parent directory: one run per rule and seed, and the table OUT/compare.csv [runs]",
        )
        _add_run_set_options(parser)
        parser.set_defaults(func=_compare)
    elif name == "claims":
        parser.add_argument(
            "--rules",
            type=_rule_list,
            default=",".join(CLAIM_RULES),
            help=f"rules trained, one run per seed each [{','.join(CLAIM_RULES)}]",
        )
        parser.add_argument("--seeds", type=_int_list, default="0,1,2", help="comma-separated seeds [0,1,2]")
        parser.add_argument(
            "--out", type=Path, default=Path("runs/claims"), help="runs, figures and claims.md go here [runs/claims]"
        )
        _add_run_set_options(parser)
        parser.add_argument("--no-train", action="store_true", help="only measure the finished runs already in OUT")
        parser.set_defaults(func=_claims)
    elif name == "demo":
        parser.add_argument("--rule", default="dppo_binary_tv", help=RULE_HELP)
        parser.add_argument(
            "--out",
            type=Path,
            default=None,
            help="run directory (default: runs/demo, replacing an earlier demo run); the dashboard opens on its "
            "parent folder, with a copy of the shipped sample runs in sample_run/ beside it",
        )
        parser.add_argument("--port", type=int, default=8501, help="port of the dashboard [8501]")
        parser.add_argument("--no-dashboard", action="store_true", help="only train; print how to inspect the run")
        parser.set_defaults(func=_demo)
    elif name == "make-sample":
        parser.add_argument(
            "--rules",
            type=_rule_list,
            default="ppo,dppo_binary_tv,pg_is",
            help="rules of the sample, one run each [ppo,dppo_binary_tv,pg_is]",
        )
        parser.add_argument(
            "--out", type=Path, default=None, help="where to write it (default: the shipped data/sample_run)"
        )
        _add_run_set_options(parser)
        parser.set_defaults(func=_make_sample)
    else:
        raise ValueError(f"trustlens.train.commands has no command {name!r}")
    if name != "make-sample":
        preset = "collapse" if name == "claims" else "default"
        parser.add_argument(
            "--preset",
            choices=list(PRESETS),
            default=preset,
            help=f"named settings that the flags below override (listed at the end) [{preset}]",
        )
    parser.add_argument("--overwrite", action="store_true", help="replace existing run directories instead of refusing")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    # compare and make-sample train several rules: per-rule thresholds make no sense there
    several = {"low", "high"} if name in ("compare", "make-sample", "claims") else set()
    _add_config_flags(parser, skip=several | ({"seed"} if name in ("compare", "claims") else set()))


def _add_config_flags(parser: argparse.ArgumentParser, skip: set[str]) -> None:
    defaults = TrainConfig.__dataclass_fields__
    group = parser.add_argument_group("training settings (default: the preset's value; shown: the default preset's)")
    for name, kind, text in _CONFIG_FLAGS:
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        shown = _SHOWN_DEFAULTS.get(name, defaults[name].default)
        group.add_argument(flag, dest=name, type=kind, default=None, help=f"{text} [{shown}]")
    group.add_argument(
        "--no-scale-advantages",
        dest="scale_advantages",
        action="store_const",
        const=False,
        default=None,
        help="advantages r − mean(r) without dividing by the group std (Dr. GRPO)",
    )


def _rule_list(text: str) -> list[str]:
    """Comma-separated rule names (checked against the registry when the configs are built)."""
    rules = [r.strip() for r in text.split(",") if r.strip()]
    if not rules:
        raise argparse.ArgumentTypeError(f"expected comma-separated rule names, got {text!r}")
    if len(set(rules)) != len(rules):
        raise argparse.ArgumentTypeError(f"a rule is listed twice in {text!r}")
    return rules


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _given(args: argparse.Namespace) -> dict:
    """The settings given on the command line (None: not given)."""
    return {f.name: getattr(args, f.name, None) for f in _config_fields()}


def _config(args: argparse.Namespace, **fixed) -> TrainConfig:
    return config_from_preset(args.preset, **{**_given(args), **fixed})


def _config_fields():
    return [f for f in fields(TrainConfig) if f.name not in ("rule", "record")]


def _check_out(path: Path, overwrite: bool) -> bool:
    """Whether an old run at `path` must be removed first; refuses to mix a new run into an
    existing directory unless --overwrite, and never replaces anything but a trustlens run."""
    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        return False
    if not overwrite:
        raise FileExistsError(f"--out {path} already exists; choose another directory or pass --overwrite")
    if not (path / "run.json").is_file():
        raise FileExistsError(f"--out {path} exists and is not a trustlens run; refusing to replace it")
    return True


def run_one(cfg, out: Path, *, overwrite: bool, quiet: bool):
    """Train `cfg` into `out` (rank 0 prepares the directory) and print a one-line summary."""
    from trustlens.train.trainer import init_world, train

    world = init_world()
    if world.main:
        if _check_out(out, overwrite):
            shutil.rmtree(out)
        print(f"training rule {cfg.rule!r} for {cfg.steps} steps (seed {cfg.seed}, {world.size} process(es)) -> {out}")
    _barrier()
    result = train(cfg, out, progress=not quiet)
    if world.main and result.eval_accuracy:
        steps = sorted(result.eval_accuracy)
        acc = " → ".join(f"{result.eval_accuracy[s]:.3f}" for s in (steps[0], steps[-1]))
        mean_time = sum(result.step_times) / len(result.step_times)
        print(f"{cfg.rule}: held-out accuracy {acc} (steps {steps[0]} → {steps[-1]}), {mean_time:.2f} s/step")
    return result


def _add_run_set_options(parser: argparse.ArgumentParser) -> None:
    """The options of the commands that train a set of runs (compare, claims): --reuse, --jobs."""
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep finished runs already in OUT with the same settings instead of training them again",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs trained at a time, each in its own process with --threads torch threads "
        "(e.g. 2 on a 2-core machine); not under torchrun [1]",
    )


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _is_main() -> bool:
    """Whether this process is rank 0 (torchrun sets RANK; a plain process is rank 0)."""
    return os.environ.get("RANK", "0") == "0"


def _finish() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _train(args: argparse.Namespace) -> int:
    cfg = _config(args, rule=args.rule)
    out = args.out or Path("runs") / args.rule
    try:
        run_one(cfg, out, overwrite=args.overwrite, quiet=args.quiet)
    finally:
        _finish()
    if _is_main():
        _print_inspect(out)
    return 0


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
    if _is_main():
        for name, path in runs.items():
            if name not in kept:
                _check_out(path, overwrite)
    if _is_main():
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
    from dataclasses import asdict

    code = "import sys; from trustlens.train.commands import _run_from_json; _run_from_json(sys.argv[1])"
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
    from dataclasses import asdict

    try:
        manifest = json.loads((path / "run.json").read_text())
    except (OSError, ValueError):
        return False
    return manifest.get("status") == "finished" and manifest.get("config") == asdict(cfg)


def compare_table(runs: list, out: Path):
    """The outcomes of `runs` (loaded Runs) and their seed table (trustlens.analysis.seeds):
    the table printed and saved as OUT/compare.csv, the outcomes as OUT/compare_runs.csv.
    Returns (table, outcomes)."""
    from trustlens.analysis.seeds import csv_safe, format_seed_table, run_outcomes, seed_table

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
            _config(args, seed=args.seeds[0]),
            overwrite=args.overwrite,
            quiet=args.quiet,
            reuse=args.reuse,
            jobs=args.jobs,
        )
    finally:
        _finish()


def _compare(args: argparse.Namespace) -> int:
    runs = _train_runs(args)
    if _is_main():
        from trustlens import load_run

        compare_table([load_run(p) for p in runs.values()], args.out)
        print(f"runs in {args.out}/; open them with trustlens.load_runs or `trustlens dashboard {args.out}`")
    return 0


# the rules the claims need: C1/C2 ppo vs dppo, C3/C6 no trust region, C4 the π_old anchor, C5 Top-K
CLAIM_RULES = ("ppo", "dppo_binary_tv", "dppo_topk_tv", "dppo_binary_tv_recompute", "pg_is", "cispo")


def _claims(args: argparse.Namespace) -> int:
    from trustlens import load_run

    runs = _finished_runs(args.out) if args.no_train else _train_runs(args)
    if not _is_main():
        return 0
    if not runs:
        raise SystemExit(f"--out {args.out} holds no runs to measure")
    loaded = [load_run(p) for p in runs.values()]
    table, outcomes = compare_table(loaded, args.out)
    report = write_claims_report(loaded, args.out, table, outcomes, preset=args.preset)
    print(f"claims report: {report}")
    return 0


def _finished_runs(folder: Path) -> dict[str, Path]:
    """The finished runs directly inside `folder` (runs still being written are left out)."""
    import json

    runs = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        try:
            status = json.loads((path / "run.json").read_text()).get("status")
        except (OSError, ValueError):
            continue
        if status == "finished":
            runs[path.name] = path
    return runs


def write_claims_report(runs, out: Path, table, outcomes, *, preset: str) -> Path:
    """Measure C1–C6 on `runs`, write OUT/figures/C*.html and OUT/claims.md (`table` and
    `outcomes` from `compare_table`); the report's path."""
    from trustlens.analysis.claims import alert_leads, measure_claims, outcome_rows
    from trustlens.analysis.seeds import format_seed_table

    claims = measure_claims(runs, outcomes)
    figures = out / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    lines = [
        "# The DPPO paper's claims, measured at this scale",
        "",
        f"{len(runs)} runs in `{out}` (preset `{preset}`), written by `trustlens claims`. "
        "Mean ± standard error (sample sd / √n) over seeds.",
        "",
    ]
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


def _demo(args: argparse.Namespace) -> int:
    cfg = _config(args, rule=args.rule)
    out = args.out or Path("runs") / "demo"
    try:
        run_one(cfg, out, overwrite=args.overwrite or args.out is None, quiet=args.quiet)
    finally:
        _finish()
    if not _is_main():
        return 0
    launch = None if args.no_dashboard else _dashboard_launcher()
    if launch is None:
        _print_inspect(out)
        return 0
    shown = _beside_sample(out)
    print(f"the dashboard opens on {shown}: the demo run {out.name!r} and the shipped sample runs in sample_run/")
    return int(launch(str(shown), port=args.port) or 0)


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


def _make_sample(args: argparse.Namespace) -> int:
    out = args.out or default_sample_dir()
    configs = sample_configs(args.rules, **_given(args))
    try:
        train_runs(configs, out, overwrite=True, quiet=args.quiet, reuse=args.reuse, jobs=args.jobs)
    finally:
        _finish()
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"sample runs ({', '.join(configs)}) written to {out}, {size / 1e6:.1f} MB")
    return 0


def _print_inspect(out: Path) -> None:
    print(
        f"run recorded in {out}\n"
        f"  dashboard:  trustlens dashboard {out}\n"
        f"  in Python:  import trustlens; run = trustlens.load_run({str(out)!r}); "
        "run.tokens.collect()  # polars"
    )
