"""One training run for the commands: its settings from the command line, the check of its
run directory, `run_one`, and the rank helpers of the commands that may run under torchrun."""

from __future__ import annotations

import argparse
import os
import shutil
from dataclasses import fields
from pathlib import Path

from trustlens.train.config import TrainConfig, config_from_preset


def given(args: argparse.Namespace) -> dict:
    """The settings given on the command line (None: not given)."""
    return {f.name: getattr(args, f.name, None) for f in _config_fields()}


def config(args: argparse.Namespace, **fixed) -> TrainConfig:
    return config_from_preset(args.preset, **{**given(args), **fixed})


def _config_fields():
    return [f for f in fields(TrainConfig) if f.name not in ("rule", "record")]


def check_out(path: Path, overwrite: bool) -> bool:
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
    """Train `cfg` into `out` (rank 0 prepares the directory) and print a one-line summary: the
    held-out accuracy and the run's one speed figure, the mean seconds of a training step
    (rollout, updates and recording; setup and evaluations excluded; the progress bar shows no
    rate of its own)."""
    from trustlens.train.trainer import train
    from trustlens.train.world import init_world

    world = init_world()
    if world.main:
        if check_out(out, overwrite):
            shutil.rmtree(out)
        print(f"training rule {cfg.rule!r} for {cfg.steps} steps (seed {cfg.seed}, {world.size} process(es)) -> {out}")
    _barrier()
    result = train(cfg, out, progress=not quiet)
    if world.main:
        steps = sorted(result.eval_accuracy)
        acc = " → ".join(f"{result.eval_accuracy[s]:.3f}" for s in (steps[0], steps[-1])) if steps else ""
        done = f"held-out accuracy {acc} (steps {steps[0]} → {steps[-1]})" if steps else f"{cfg.steps} steps"
        per_step = sum(result.step_times) / max(len(result.step_times), 1)
        print(f"{cfg.rule}: {done}, {per_step:.2f} s/step (training; setup and evaluations excluded)")
    if world.main and result.stopped:
        from trustlens.live.watch import stopped_text

        print(stopped_text(result.stopped, str(out)))
    return result


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def is_main() -> bool:
    """Whether this process is rank 0 (torchrun sets RANK; a plain process is rank 0)."""
    return os.environ.get("RANK", "0") == "0"


def finish() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def print_inspect(out: Path) -> None:
    print(
        f"run recorded in {out}\n"
        f"  dashboard:  trustlens dashboard {out}\n"
        f"  in Python:  import trustlens; run = trustlens.load_run({str(out)!r}); "
        "run.tokens.collect()  # polars"
    )
