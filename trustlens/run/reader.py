"""Reading recorded runs: `load_run(path)` → `Run`, `load_runs(folder)` → every run below it.

A `Run` is a snapshot of a run directory (DESIGN §4) taken when it is loaded: its manifest and
the list of its complete part files. `Run.tokens`, `.samples` and `.metrics` are polars
LazyFrames over the part files of all ranks, so queries read only the columns and row groups
they need. Load the run again to see rows written since.

Missing tables: a run without token rows yet raises `NoRowsError` from `Run.tokens` (there is
nothing to analyse, and the message says whether the run is still being written); samples and
metrics are optional (a plain training loop may never log them), so without part files they are
empty LazyFrames with the right schema.

Part files whose footer cannot be read (truncated or corrupt, e.g. copied while being written)
are skipped with a `CorruptPartWarning` naming the file; the rest of the run still loads.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from trustlens.run.schema import (
    MANIFEST,
    META_SCHEMA_VERSION,
    PART_GLOB,
    SCHEMA_VERSION,
    TABLES,
    table_schema,
)


class NotARunError(ValueError):
    """The path is not a readable trustlens run directory."""


class NoRowsError(ValueError):
    """The run has no rows in the table asked for (yet)."""


class CorruptPartWarning(UserWarning):
    """A part file could not be read and was skipped."""


@dataclass(frozen=True)
class Run:
    """A recorded run, as loaded by `load_run`."""

    path: Path  # the run directory
    manifest: dict[str, Any] = field(repr=False)  # run.json (trustlens.run.MANIFEST_FIELDS)
    files: dict[str, tuple[Path, ...]] = field(repr=False)  # table -> readable part files

    @property
    def name(self) -> str:
        """The run directory's name."""
        return self.path.name

    @property
    def status(self) -> str:
        """running | finished | failed (a killed run stays `running`: see manifest["updated"])."""
        return str(self.manifest.get("status"))

    @property
    def rules(self) -> dict[str, dict[str, Any]]:
        """The evaluated rules in column order: {name: {low, high, anchor, ...}}."""
        return dict(self.manifest.get("rules") or {})

    @property
    def active_rule(self) -> str | None:
        """The rule the run trained with, when known."""
        return self.manifest.get("active_rule")

    @property
    def tokens(self) -> pl.LazyFrame:
        """One row per (step, update, sample, position), all ranks; NoRowsError when empty."""
        if not self.files["tokens"]:
            state = "is still being written" if self.status == "running" else f"is {self.status}"
            raise NoRowsError(
                f"run {str(self.path)!r} has no token rows yet (it {state}; the recorder writes a "
                "part file every rows_per_file rows or flush_seconds seconds)"
            )
        return self._scan("tokens")

    @property
    def samples(self) -> pl.LazyFrame:
        """One row per (step, sample), all ranks; empty when the run logged none."""
        return self._scan("samples")

    @property
    def metrics(self) -> pl.LazyFrame:
        """Long-format metrics (step, rank, name, value), all ranks; empty when none were logged."""
        return self._scan("metrics")

    def _scan(self, table: str) -> pl.LazyFrame:
        files = self.files[table]
        if not files:
            rules = list(self.rules) if table == "tokens" else []
            return pl.from_arrow(table_schema(table, rules).empty_table()).lazy()
        return pl.scan_parquet([str(f) for f in files], hive_partitioning=False)


def _read_manifest(path: Path) -> dict[str, Any]:
    manifest_path = path / MANIFEST
    if not path.is_dir():
        raise NotARunError(f"{str(path)!r} is not a trustlens run: no such directory")
    if not manifest_path.is_file():
        raise NotARunError(
            f"{str(path)!r} is not a trustlens run: it has no {MANIFEST} (a run directory is "
            "written by trustlens.TokenRecorder)"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise NotARunError(f"{str(manifest_path)!r} is unreadable: {err}") from err
    version = manifest.get("schema_version") if isinstance(manifest, dict) else None
    if not isinstance(version, int):
        raise NotARunError(f"{str(manifest_path)!r} has no integer schema_version: not a trustlens manifest")
    if version > SCHEMA_VERSION:
        raise NotARunError(
            f"run {str(path)!r} was written with schema version {version} (trustlens "
            f"{manifest.get('trustlens_version')}); this trustlens reads up to version "
            f"{SCHEMA_VERSION}: upgrade trustlens"
        )
    return manifest


def _readable_parts(path: Path, table: str) -> tuple[Path, ...]:
    """The part files of `table` whose footer reads, in (rank, part) order; others warned about."""
    files = sorted((path / table).glob(PART_GLOB), key=lambda p: (int(p.parent.name[5:]), p.name))
    readable = []
    for f in files:
        try:
            meta = pq.read_metadata(f).metadata or {}
        except (OSError, ValueError) as err:
            warnings.warn(f"skipping unreadable part file {f}: {err}", CorruptPartWarning, stacklevel=3)
            continue
        version = int(meta.get(META_SCHEMA_VERSION, b"0") or 0)
        if version > SCHEMA_VERSION:
            raise NotARunError(
                f"part file {f} was written with schema version {version}; this trustlens reads up "
                f"to version {SCHEMA_VERSION}: upgrade trustlens"
            )
        readable.append(f)
    return tuple(readable)


def load_run(path: str | os.PathLike) -> Run:
    """The run in directory `path` (or the directory of the run.json `path` names).

    Raises NotARunError (a ValueError) when `path` is not a run directory, its run.json is
    unreadable, or it was written with a newer schema version than this trustlens reads.
    """
    path = Path(path).expanduser()
    if path.name == MANIFEST and path.is_file():
        path = path.parent
    manifest = _read_manifest(path)
    files = {table: _readable_parts(path, table) for table in TABLES}
    return Run(path=path, manifest=manifest, files=files)


def load_runs(folder: str | os.PathLike) -> list[Run]:
    """Every run at or below `folder`, sorted by path. Directories that look like runs but cannot
    be loaded are skipped with a warning; part folders of runs are not searched."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise NotARunError(f"{str(folder)!r} is not a directory")
    runs = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        if MANIFEST not in names:
            continue
        dirs[:] = [d for d in dirs if d not in TABLES]
        try:
            runs.append(load_run(root))
        except NotARunError as err:
            warnings.warn(f"skipping {root}: {err}", stacklevel=2)
    return sorted(runs, key=lambda r: r.path)
