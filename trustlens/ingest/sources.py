"""The logs `trustlens import` reads, each into one `Log`: its values in the order logged.

    a TensorBoard log dir       event files (trustlens.ingest.events), in it or one folder below
    a W&B offline run           wandb/offline-run-*/ (or its run-*.wandb file)
    a W&B history export        .csv (a `_step` column) or .json
    verl's file logger          .jsonl of {"step": S, "data": {name: value}} (verl/utils/tracking.py, FileLogger)
    HF Trainer / TRL            trainer_state.json: its `log_history`, each entry with `step`
    JSON lines                  .jsonl rows with a `step` (or `_step`) and values

One log holds one run: a folder whose event files lie in several folders, or several W&B runs,
is refused, naming them. A corrupt event or .wandb file is skipped with a warning naming it.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trustlens.ingest.events import CorruptEventFile, EventFile, event_files
from trustlens.ingest.wandb_log import CorruptWandbFile, history_rows, wandb_rows

# kind of log -> the framework its format implies (None: the names must tell)
KIND_FRAMEWORK = {"verl-jsonl": "verl", "trainer-state": "trl"}


class ImportWarning(UserWarning):
    """Something of a log that was not imported as it was (a corrupt file, a value, a step)."""


@dataclass
class Log:
    """The values of one run's log, in the order they were logged (a value may repeat a step)."""

    kind: str  # tensorboard, wandb, wandb-history, verl-jsonl, trainer-state, jsonl
    path: Path  # what was read
    steps: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)  # numbers, or what the log held (text, lists, ...)
    texts: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # text summaries: tag -> (step, text)
    files: list[Path] = field(default_factory=list)  # the files read

    def add_row(self, step: int, row: dict[str, Any]) -> None:
        for name, value in row.items():
            self.steps.append(step)
            self.names.append(name)
            self.values.append(value)


Progress = Callable[[str], None]


def stderr_progress(every: float = 1.0) -> Progress:
    """A progress callback that prints to stderr at most every `every` seconds."""
    last = [0.0]

    def show(text: str) -> None:
        now = time.monotonic()
        if now - last[0] >= every:
            last[0] = now
            print(f"trustlens import: {text}", file=sys.stderr, flush=True)

    return show


def read_log(src: str | Path, progress: Progress | None = None) -> Log:
    """The Log at `src` (module docstring); ValueError (one line) for anything else."""
    path = Path(src)
    if not path.exists():
        raise FileNotFoundError(
            f"{path}: no such file or folder (give a TensorBoard log dir, a W&B run or a metrics file)"
        )
    if path.is_dir():
        if _wandb_files(path) and not event_files(path):
            return _wandb_dir(path)
        if (path / "trainer_state.json").is_file() and not event_files(path):
            return _trainer_state(path / "trainer_state.json")
        return tensorboard_log(path, progress)
    if path.suffix == ".wandb":
        return _wandb_file(path, Log("wandb", path))
    if path.name == "trainer_state.json" or _is_trainer_state(path):
        return _trainer_state(path)
    if path.suffix.lower() == ".csv":
        return _rows(Log("wandb-history", path), history_rows(path))
    if path.suffix.lower() in (".json", ".jsonl"):
        return _json_lines(path)
    if path.name.startswith("events.out.tfevents."):
        return _events(Log("tensorboard", path), [path], progress)
    raise ValueError(
        f"{path}: not a log trustlens import reads (a TensorBoard log dir, a W&B run, a .csv/.json/.jsonl "
        "metrics file or trainer_state.json)"
    )


def one_run_folders(folder: Path, files: list[Path]) -> None:
    """Refuse event files of several runs: files in more than one folder (a folder per run)."""
    folders = sorted({f.parent for f in files})
    if len(folders) > 1:
        names = ", ".join(str(f.relative_to(folder)) or "." for f in folders[:4])
        more = f" and {len(folders) - 4} more" if len(folders) > 4 else ""
        raise ValueError(
            f"{folder} holds the event files of {len(folders)} runs ({names}{more}): import one at a time, "
            f"e.g. trustlens import {folders[0]} --out RUN"
        )


def tensorboard_log(folder: Path, progress: Progress | None = None) -> Log:
    files = event_files(folder)
    if not files:
        raise ValueError(f"{folder}: no TensorBoard event files (events.out.tfevents.*) in it or below")
    one_run_folders(folder, files)
    return _events(Log("tensorboard", folder), files, progress)


def _events(log: Log, files: list[Path], progress: Progress | None) -> Log:
    total = sum(f.stat().st_size for f in files)
    done = 0
    for f in files:
        try:
            got = EventFile(f).read()
        except (CorruptEventFile, OSError) as err:
            warnings.warn(
                f"skipping corrupt event file {f}: {err}; the other files are imported", ImportWarning, stacklevel=2
            )
            continue
        finally:
            done += f.stat().st_size
        log.steps += got.steps
        log.names += got.names
        log.values += got.values
        for tag, items in got.texts.items():
            log.texts.setdefault(tag, []).extend(items)
        log.files.append(f)
        if progress is not None:
            progress(f"read {done / 2**20:.1f} MiB of {total / 2**20:.1f} MiB ({len(log.steps):,} values)")
    if not log.files:
        raise ValueError(f"{log.path}: none of its {len(files)} event files could be read")
    return log


def _wandb_files(folder: Path) -> list[Path]:
    """The W&B run files in `folder`, in its offline-run-* folders, or in those of its wandb/."""
    return sorted([*folder.glob("run-*.wandb"), *folder.glob("*/run-*.wandb"), *folder.glob("wandb/*/run-*.wandb")])


def _wandb_dir(folder: Path) -> Log:
    runs = _wandb_files(folder)
    if len(runs) > 1:
        names = ", ".join(str(r.relative_to(folder)) for r in runs[:4])
        raise ValueError(
            f"{folder} holds {len(runs)} W&B runs ({names}): import one at a time, "
            f"e.g. trustlens import {runs[0].parent} --out RUN"
        )
    return _wandb_file(runs[0], Log("wandb", folder))


def _wandb_file(path: Path, log: Log) -> Log:
    log.files.append(path)
    try:
        _rows(log, wandb_rows(path))
    except CorruptWandbFile as err:
        if not log.steps:
            raise ValueError(f"{err}: nothing could be read") from None
        warnings.warn(f"{err}: the history before it is imported", ImportWarning, stacklevel=2)
    return log


def _rows(log: Log, rows: Iterable[tuple[int, dict[str, Any]]]) -> Log:
    for step, row in rows:
        log.add_row(step, row)
    if not log.files:
        log.files.append(log.path)
    return log


def _is_trainer_state(path: Path) -> bool:
    if path.suffix.lower() != ".json":
        return False
    with open(path, "rb") as f:
        head = f.read(4096)
    return b'"log_history"' in head or b'"best_metric"' in head


def _trainer_state(path: Path) -> Log:
    state = json.loads(path.read_text())
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise ValueError(f"{path}: a trainer_state.json without a log_history list")
    log = Log("trainer-state", path)
    for entry in history:
        if isinstance(entry, dict) and "step" in entry:
            log.add_row(int(entry["step"]), {k: v for k, v in entry.items() if k != "step"})
    return _rows(log, ())


def _json_lines(path: Path) -> Log:
    text = path.read_text()
    if text.lstrip().startswith("["):  # a W&B history exported to JSON
        return _rows(Log("wandb-history", path), history_rows(path))
    log = Log("jsonl", path)
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            warnings.warn(f"{path}:{n}: not JSON ({err}); the line is skipped", ImportWarning, stacklevel=2)
            continue
        if not isinstance(row, dict) or ("step" not in row and "_step" not in row):
            warnings.warn(f"{path}:{n}: a line without a step; skipped", ImportWarning, stacklevel=2)
            continue
        step = row.pop("step", None)
        step = row.pop("_step", step)
        data = row.get("data")
        if isinstance(data, dict) and len(row) == 1:  # verl's FileLogger: {"step": S, "data": {...}}
            log.kind = "verl-jsonl"
            row = data
        log.add_row(int(step), row)
    return _rows(log, ())


__all__ = ["KIND_FRAMEWORK", "ImportWarning", "Log", "Progress", "read_log", "stderr_progress", "tensorboard_log"]
