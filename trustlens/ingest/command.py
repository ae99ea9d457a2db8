"""`trustlens import SRC --out RUN`: a finished run's TensorBoard, W&B or JSON log as a trustlens
run holding its metrics, and the collapse alerts found on it (docs/import.md).

    trustlens import tensorboard_log/project/experiment --out runs/experiment
    trustlens import wandb/offline-run-20260101_000000-abc123 --out runs/abc123
    trustlens import checkpoints/trainer_state.json --out runs/trl --framework trl

Progress goes to stderr while a large log is read; each alert is printed as `trustlens watch`
prints it. `--framework` says whose names the log holds when the names do not tell.
"""

from __future__ import annotations

import argparse
import sys

from trustlens.metrics import FRAMEWORKS

# --framework: a framework of the names table, or trustlens (a log `trustlens export` wrote)
FRAMEWORK_CHOICES = (*FRAMEWORKS, "trustlens")


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """Flags of `trustlens import`."""
    parser.add_argument(
        "src",
        metavar="SRC",
        help="a TensorBoard log dir, a W&B offline run (wandb/offline-run-*), a W&B history .csv/.json, "
        "verl's file-logger .jsonl or HF Trainer's trainer_state.json",
    )
    parser.add_argument("--out", required=True, metavar="RUN", help="the run directory to write (a new one)")
    parser.add_argument(
        "--framework",
        choices=FRAMEWORK_CHOICES,
        default=None,
        help="whose metric names the log holds (default: told from the names)",
    )
    parser.add_argument(
        "--model-kind",
        choices=("dense", "moe"),
        default=None,
        help="the model's kind, for the mismatch's normal range [dense]",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a run already at --out")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.epilog = "What is read and how names are mapped: docs/import.md, docs/metrics.md"
    parser.set_defaults(func=_import)


def _import(args: argparse.Namespace) -> int:
    from trustlens.analysis.collapse import detect_collapse
    from trustlens.ingest.importer import import_log
    from trustlens.ingest.sources import stderr_progress
    from trustlens.live.alert import LiveAlert
    from trustlens.live.watch import alert_line
    from trustlens.run import load_run

    progress = None if args.quiet else stderr_progress()
    done = import_log(
        args.src,
        args.out,
        framework=args.framework,
        model_kind=args.model_kind,
        overwrite=args.overwrite,
        progress=progress,
    )
    table = done.table
    framework = done.framework or "unknown (names kept as logged; give --framework)"
    print(
        f"imported {done.steps} steps, {table.metrics['name'].n_unique()} metrics from {done.log.kind} log "
        f"{args.src} (framework {framework}) into {done.path}"
    )
    if table.renamed:
        shown = ", ".join(f"{a} → {b}" for a, b in list(table.renamed.items())[:6])
        more = f" and {len(table.renamed) - 6} more" if len(table.renamed) > 6 else ""
        print(f"  {len(table.renamed)} names mapped to trustlens': {shown}{more}")
    alerts = detect_collapse(load_run(done.path))
    for row in alerts.iter_rows(named=True):
        alert = LiveAlert.from_record(
            row, source="collapse", raised_at_step=row["end_step"], raised_wall_time=0.0, provisional=False
        )
        print(alert_line(alert, live=False))
    critical = alerts.filter(alerts["severity"] == "critical").height if alerts.height else 0
    print(
        f"{alerts.height} alerts ({critical} critical); see them with: trustlens dashboard {done.path}", file=sys.stdout
    )
    return 0


__all__ = ["configure"]
