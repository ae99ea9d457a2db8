"""`trustlens export`: recorded runs to TensorBoard event files or W&B runs.

    trustlens export RUN [RUN ...] --to tensorboard LOGDIR
    trustlens export RUN [RUN ...] --to wandb [PROJECT]      # WANDB_MODE=offline: no network

Per run: every step's scalars (trustlens.export.scalars: block rates per rule and advantage sign
over A ≠ 0 tokens, zero_adv_frac, the mismatch metrics, reward, accuracy and every other logged
metric) and the collapse alerts (trustlens.analysis.detect_collapse). TensorBoard gets one
sub-directory per run (LOGDIR/<run name>) with the alerts as text (tag `alerts/text_summary`); W&B
gets one W&B run per trustlens run, named after it, with the alerts and their driving tokens as
tables (`alerts`, `driving_tokens`). Runs may be local paths or object-store URLs.
"""

from __future__ import annotations

import argparse
import os
import posixpath
from collections.abc import Sequence
from typing import Any

import polars as pl

from trustlens.analysis.collapse import detect_collapse, step_signals
from trustlens.analysis.sources import require_run
from trustlens.core.argument_checks import check_choice, check_path, check_type
from trustlens.export.scalars import run_settings, step_scalars, with_signals
from trustlens.export.sinks import TensorBoardSink, WandbSink
from trustlens.run import NoRowsError, load_run

# columns of the driving-token table
DRIVER_COLUMNS = (
    *("alert_step", "kind", "severity", "sample", "update", "pos", "token", "mu", "pi_old", "pi", "advantage"),
)


# names of the held-out evaluation's scalars: a run of N steps evaluates after its last step too,
# logged at step N, a step that trained nothing
EVALUATION_PREFIXES = ("eval/", "time/eval")


def export_run(run, sink) -> int:
    """Send `run`'s scalars and alerts to `sink`; the number of training steps sent, as the run
    counts its steps: a step holding only evaluation scalars (`EVALUATION_PREFIXES`, the
    evaluation after the last step) is sent but not counted, so a 160-step run gives 160."""
    signals = _signals(run)
    scalars = step_scalars(run) if signals is None else with_signals(step_scalars(run), signals)
    if hasattr(sink, "log_settings"):
        sink.log_settings(run_settings(run))
    steps = 0
    for (step,), part in scalars.group_by("step", maintain_order=True):
        names = part["name"].to_list()
        sink.log_step(int(step), dict(zip(names, part["value"].to_list(), strict=True)))
        steps += not all(name.startswith(EVALUATION_PREFIXES) for name in names)
    alerts = pl.DataFrame() if signals is None else detect_collapse(run, signals=signals)
    if alerts.height:
        sink.log_alerts(alerts)
        if hasattr(sink, "log_table"):
            sink.log_table("driving_tokens", driving_tokens(run, alerts))
    sink.flush()
    return steps


def export_tensorboard(runs: Sequence[Any], logdir: str | os.PathLike) -> dict[str, int]:
    """Each run (a Run or a path) into LOGDIR/<run name>; {run name: steps written}."""
    check_path("logdir", logdir)
    done = {}
    for run in _runs(runs):
        sink = TensorBoardSink(_join(os.fspath(logdir), run.name))
        try:
            done[run.name] = export_run(run, sink)
        finally:
            sink.close()
    return done


def export_wandb(runs: Sequence[Any], *, project: str | None = None, **init: Any) -> dict[str, int]:
    """Each run into a W&B run of its own (named after it, its config as the W&B config);
    `init` goes to wandb.init (e.g. dir=, mode="offline", entity=). {run name: steps logged}."""
    done = {}
    for run in _runs(runs):
        config = run.manifest.get("config") or {}
        sink = WandbSink(project=project, name=run.name, config=config, reinit="finish_previous", **init)
        try:
            done[run.name] = export_run(run, sink)
        finally:
            sink.close()
    return done


def driving_tokens(run, alerts: pl.DataFrame) -> pl.DataFrame:
    """The tokens behind each alert with their text, μ, π_old, π and advantage: columns
    DRIVER_COLUMNS, one alert's tokens after another in the order of `alerts`, each alert's in the
    order of its `tokens` list (strongest first, ties by sample, update, position:
    `trustlens.analysis.collapse.drivers`). π_old is shown beside π because mismatch_growth ranks by μ
    against π_old. Token text is untrusted: shown as text."""
    require_run("driving_tokens", run)
    check_type("alerts", alerts, pl.DataFrame, "a polars DataFrame of alerts (trustlens.analysis.detect_collapse)")
    keys = (
        alerts.with_row_index("alert")
        .select(
            "alert",
            pl.col("step").alias("alert_step"),
            "kind",
            "severity",
            "tokens",
            pl.int_ranges(pl.col("tokens").list.len()).alias("rank"),
        )
        .explode("tokens", "rank")
        .drop_nulls("tokens")
        .unnest("tokens")
    )
    if keys.is_empty():
        return pl.DataFrame(schema=dict.fromkeys(DRIVER_COLUMNS, pl.String))
    rows = run.tokens.filter(pl.col("step").is_in(keys["alert_step"].unique().implode())).select(
        pl.col("step").alias("alert_step"),
        pl.col("sample").cast(pl.Int64),
        pl.col("update").cast(pl.Int64),
        pl.col("pos").cast(pl.Int64),
        pl.col("token").cast(pl.String),
        pl.col("mu_logp").exp().alias("mu"),
        pl.col("old_logp").exp().alias("pi_old"),
        pl.col("pi_logp").exp().alias("pi"),
        "advantage",
    )
    joined = keys.lazy().join(rows, on=["alert_step", "sample", "update", "pos"], how="left")
    return joined.sort("alert", "rank").select(DRIVER_COLUMNS).collect()


# what --to exports into (its first word)
KINDS = ("tensorboard", "wandb")


class _Destination(argparse.Action):
    """--to KIND [DEST]: KIND one of KINDS, a typo answered with the closest while the flags are parsed."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        try:
            check_choice("KIND", values[0], KINDS)
        except ValueError as err:
            raise argparse.ArgumentError(self, str(err)) from None
        setattr(namespace, self.dest, values)


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """Flags of `trustlens export`."""
    # "*": runs written after --to are taken by it; _export says so instead of "RUN is required"
    parser.add_argument("runs", nargs="*", metavar="RUN", help="recorded runs (folders or object-store URLs)")
    parser.add_argument(
        "--to",
        nargs="+",
        required=True,
        metavar=("KIND", "DEST"),
        action=_Destination,
        help="tensorboard LOGDIR (one sub-directory per run), or wandb [PROJECT] (W&B settings from "
        "its environment, e.g. WANDB_MODE=offline)",
    )
    # the runs come first: --to takes one or two words, so runs after it would be read as its own
    parser.usage = "%(prog)s RUN [RUN ...] --to {tensorboard LOGDIR | wandb [PROJECT]}"
    parser.epilog = "What is exported and under which names: docs/export.md"
    parser.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    kind, *dest = args.to
    if not args.runs:  # main prints "trustlens export: error: ..." and exits 2, as argparse would
        raise ValueError(f"no RUN given: put the runs before --to (--to takes one or two words, got {args.to})")
    if kind == "tensorboard" and len(dest) == 1:
        done = export_tensorboard(args.runs, dest[0])
    elif kind == "wandb" and len(dest) <= 1:
        done = export_wandb(args.runs, project=dest[0] if dest else None)
    else:
        raise ValueError(f"--to must be 'tensorboard LOGDIR' or 'wandb [PROJECT]', got {args.to}")
    for name, steps in done.items():
        print(f"{name}: {steps} training steps and their evaluations exported to {kind}{' ' + dest[0] if dest else ''}")
    return 0


def _signals(run) -> pl.DataFrame | None:
    """The run's collapse signals (step_signals), None without token rows yet."""
    try:
        return step_signals(run)
    except NoRowsError:
        return None


def _runs(runs: Sequence[Any]):
    if isinstance(runs, (str, os.PathLike)) or not runs:
        raise ValueError("runs must be a non-empty list of runs or run paths")
    for run in runs:
        yield load_run(run) if isinstance(run, (str, os.PathLike)) else run


def _join(base: str, name: str) -> str:
    return posixpath.join(base, name) if "://" in base else os.path.join(base, name)


__all__ = ["DRIVER_COLUMNS", "driving_tokens", "export_run", "export_tensorboard", "export_wandb"]
