"""A TensorBoard log dir followed while it is written (`trustlens watch LOGDIR`): each poll reads
only the event records written since the last one (trustlens.ingest.events.EventFile keeps each
file's offset; a frame still being written is read at the next poll), and new event files as
they appear.

A step is complete once a later step was logged (every frame of a step is written before the
next step's) or the follower finishes. Each complete step's values become its metrics rows
under trustlens' names (trustlens.ingest.table, as `trustlens import` maps them), which a
`trustlens.live.LiveMonitor` holding the imported run's run.json judges: the alerts are those
`trustlens import` finds on the finished dir. The framework is told from the names of the first
complete step (or given). A value logged at a step already judged (a resumed writer) cannot
change the alerts raised: it is left out with a warning, where the import of the finished dir
keeps the value logged last.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import polars as pl

from trustlens.ingest.events import CorruptEventFile, EventFile, Values, event_files
from trustlens.ingest.importer import check_model_kind, framework_of, imported_manifest
from trustlens.ingest.sources import ImportWarning, Log, one_run_folders
from trustlens.ingest.table import metrics_table


def is_event_dir(path) -> bool:
    """Whether `path` is a local folder holding TensorBoard event files and no run.json."""
    folder = Path(path) if not str(path).startswith(("s3://", "gs://", "memory://")) else None
    return folder is not None and folder.is_dir() and not (folder / "run.json").exists() and bool(event_files(folder))


class EventFollower:
    """The complete steps of a TensorBoard log dir being written (module docstring)."""

    def __init__(self, folder, *, framework: str | None = None, model_kind: str | None = None) -> None:
        check_model_kind(model_kind)
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise FileNotFoundError(f"{self.folder}: no such folder (give the TensorBoard log dir being written)")
        self.framework, self.model_kind = framework, model_kind
        self.manifest: dict | None = None  # the imported run's run.json, once the first step is complete
        self._files: dict[Path, EventFile] = {}
        self._pending = Values()
        self._texts: dict[str, list[tuple[int, str]]] = {}
        self.last_step: int | None = None  # the last step handed out
        self._late: set[str] = set()

    def _read(self) -> bool:
        """Read what was written since the last call; whether anything was."""
        files = event_files(self.folder)
        one_run_folders(self.folder, files)
        before = len(self._pending.values)
        for f in files:
            reader = self._files.setdefault(f, EventFile(f))
            try:
                reader.read(self._pending)
            except (CorruptEventFile, OSError) as err:
                warnings.warn(f"skipping corrupt event file {f}: {err}", ImportWarning, stacklevel=3)
                self._files[f] = EventFile(f, offset=f.stat().st_size)  # not read again
        for tag, items in self._pending.texts.items():
            self._texts.setdefault(tag, []).extend(items)
        self._pending.texts = {}
        return len(self._pending.values) > before

    def poll(self, *, finish: bool = False) -> list[tuple[int, pl.DataFrame]]:
        """(step, its metrics rows: step, name, value) of each step complete since the last
        call, in step order; `finish`: the log is done, every step is complete."""
        self._read()
        p = self._pending
        if not p.steps:
            return []
        top = max(p.steps)
        done = [i for i, s in enumerate(p.steps) if s < top or finish]
        if not done:
            return []
        keep = [i for i, s in enumerate(p.steps) if not (s < top or finish)]
        log = Log("tensorboard", self.folder)
        log.steps = [p.steps[i] for i in done]
        log.names = [p.names[i] for i in done]
        log.values = [p.values[i] for i in done]
        log.texts = self._texts
        self._pending = Values([p.steps[i] for i in keep], [p.names[i] for i in keep], [p.values[i] for i in keep])
        if self.last_step is not None:
            late = [i for i, s in enumerate(log.steps) if s <= self.last_step]
            if late:
                names = sorted({log.names[i] for i in late} - self._late)
                self._late.update(names)
                if names:
                    warnings.warn(
                        f"{len(late)} values logged at steps already judged (e.g. {log.names[late[0]]!r} at step "
                        f"{log.steps[late[0]]}): left out of the live alerts",
                        ImportWarning,
                        stacklevel=2,
                    )
                keep_i = [i for i, s in enumerate(log.steps) if s > self.last_step]
                log.steps = [log.steps[i] for i in keep_i]
                log.names = [log.names[i] for i in keep_i]
                log.values = [log.values[i] for i in keep_i]
        if not log.steps:
            return []
        if self.manifest is None:
            self.framework = framework_of(log, self.framework)
            log.files = sorted(self._files)
            self.manifest = imported_manifest(log, self.framework, self.model_kind)
        table = metrics_table(log, self.framework).metrics
        out = [(int(k[0]), part) for k, part in table.partition_by("step", as_dict=True, maintain_order=True).items()]
        out.sort(key=lambda x: x[0])
        self.last_step = out[-1][0]
        return out


__all__ = ["EventFollower", "is_event_dir"]
