"""Reading recorded runs: `load_run(path)` → `Run`, `load_runs(folder)` → every run below it.

A `Run` is a snapshot of a run directory (docs/run-format.md) taken when it is loaded: its
manifest and the list of its complete part files. `Run.tokens`, `.samples` and `.metrics` are
polars LazyFrames over the part files of all ranks, with a `rank` column from each file's
`rank=R` folder, so queries read only the columns and row groups they need. Load the run again
to see rows written since. Paths are used as paths, never as glob patterns.

Missing tables: a run without token rows yet raises `NoRowsError` from `Run.tokens`; samples and
metrics are optional, so without part files they are empty LazyFrames with the right schema.

Integrity: every part file's footer is read at load. With `verify=True` (the default) each part
file's pages are also read once with their CRC checksums checked (pyarrow); a file is verified
once per process (keyed by path, size and modification time: part files never change once
written), so reloading a run costs only the new files. The first load costs about one full read
of the run (docs/run-format.md gives measured numbers). A truncated or corrupt part, a checksum
mismatch, a stray file or folder in a table folder (e.g. `rank=0 copy`) and an unreadable
run.json each give a `RunWarning` naming the file, and the rest of the run still loads.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from trustlens.core.argument_checks import check_bool, check_path
from trustlens.run.compact import replaced_indices
from trustlens.run.errors import CorruptPartWarning, NoRowsError, NotARunError, RunWarning
from trustlens.run.manifest import MANIFEST, NEEDED_FIELDS, read_manifest
from trustlens.run.parts import Location, list_folder, source, verify_pages
from trustlens.run.scan import column_key, conform, scan_files, warn, with_derived
from trustlens.run.schema import (
    META_SCHEMA_VERSION,
    META_WORLD_SIZE,
    RANK,
    SCHEMA_VERSION,
    TABLES,
    UPDATE_TABLES,
    frame_schema,
    part_index,
    rank_of_dir,
    rule_of_column,
    table_schema,
)
from trustlens.run.storage import Remote, is_url, local_path

__all__ = [
    "CorruptPartWarning",
    "NoRowsError",
    "NotARunError",
    "Part",
    "Run",
    "load_run",
    "load_runs",
    "naming_runs_inside",
]


class RecordedRules(dict):
    """A run's rules as its run.json recorded them ({name: manifest entry}). The analyses read
    such entries leniently, as any reader of a run (an entry written by a newer trustlens may hold
    fields this one does not know; a custom rule written before entries kept its measure cannot be
    rebuilt): what cannot be used is left out with a warning, where thresholds a caller types are
    checked strictly (`trustlens.analysis.sources.check_rule_entries`)."""


@dataclass(frozen=True)
class Part:
    """One readable part file."""

    path: Location  # the file
    rank: int  # from its rank=R folder
    rank_in_file: bool  # schema 1: the file holds a `rank` column too
    # (name, Arrow type) of the file's columns, from its footer: parts that differ from the run's
    # schema are read apart and conformed to it (`conform`)
    columns: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)
    world_size: int | None = field(default=None, compare=False)  # its writer's (None: not stamped)


@dataclass(frozen=True)
class Run:
    """A recorded run, as loaded by `load_run`."""

    path: Location  # the run directory (a trustlens.run.storage.Remote on an object store)
    manifest: dict[str, Any] = field(repr=False)  # run.json (trustlens.run.MANIFEST_FIELDS)
    parts: dict[str, tuple[Part, ...]] = field(repr=False)  # table -> readable part files
    # table -> part files skipped as unreadable (truncated, corrupt: warned at load)
    unreadable: dict[str, tuple[Location, ...]] = field(default_factory=dict, repr=False)

    @property
    def files(self) -> dict[str, tuple[Location, ...]]:
        """table -> paths of its readable part files, in (rank, part) order."""
        return {table: tuple(p.path for p in parts) for table, parts in self.parts.items()}

    @property
    def name(self) -> str:
        """The run directory's name."""
        return self.path.name

    @property
    def status(self) -> str:
        """running | finished | stopped | interrupted | failed, or unknown when run.json is unreadable
        (a run killed by SIGKILL stays `running`: see manifest["updated"])."""
        return str(self.manifest.get("status"))

    @property
    def rules(self) -> RecordedRules:
        """The evaluated rules in column order: {name: {low, high, anchor, ...}}, as run.json
        recorded them (`RecordedRules`)."""
        return RecordedRules(self.manifest.get("rules") or {})

    @property
    def active_rule(self) -> str | None:
        """The rule the run trained with, when known."""
        return self.manifest.get("active_rule")

    @property
    def tokens(self) -> pl.LazyFrame:
        """One row per (step, update, sample, position), all ranks; NoRowsError when empty."""
        if not self.parts["tokens"]:
            skipped = self.unreadable.get("tokens", ())
            if skipped:
                raise NoRowsError(
                    f"run {str(self.path)!r} has no readable token rows: its {len(skipped)} token part "
                    f"file(s) could not be read (truncated or corrupt, e.g. {skipped[0]}); restore them from "
                    "a copy or record the run again"
                )
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

    @property
    def aggregates(self) -> pl.LazyFrame:
        """Exact per-call aggregates of all tokens (step, update, rank and the columns of
        trustlens.run.aggregates) of a run recorded with `Keep`; empty otherwise."""
        return self._scan("aggregates")

    @property
    def alerts(self) -> pl.LazyFrame:
        """The alerts raised live while the run was written (trustlens.live; docs/run-format.md):
        one row per alert raised or changed, with the step and wall time it was; empty for a run
        recorded without alerts. `trustlens.live.live_alerts(run)` gives each alert's last row."""
        return self._scan("alerts")

    @property
    def routing(self) -> pl.LazyFrame:
        """Exact per-(step, update, rank, layer) routing counts of a mixture-of-experts run
        (trustlens.run.routes; docs/run-format.md): empty for a dense run."""
        return self._scan("routing")

    @property
    def sampled(self) -> bool:
        """Whether the token rows are a sample (recorded with `Keep`; weights in `weight`)."""
        return bool(self.parts.get("aggregates"))

    def _scan(self, table: str) -> pl.LazyFrame:
        parts = self.parts[table]
        if not parts:
            rules = list(self.rules) if table in ("tokens", "aggregates") else []
            return pl.from_arrow(frame_schema(table, rules).empty_table()).lazy()  # type: ignore[union-attr]
        rules = list(self.rules) if table in ("tokens", "aggregates") else []
        expected = column_key(table_schema(table, rules))
        # parts of one rank and one schema are scanned together; a schema other than the run's
        # (a column dropped, added, renamed or widened by hand, an older aggregates table, a rule
        # set changed on resume) is read apart and conformed to the run's columns
        groups: dict[tuple[int, bool, tuple[tuple[str, str], ...]], list[Location]] = {}
        for p in parts:
            columns = tuple(c for c in p.columns if c[0] != RANK)
            groups.setdefault((p.rank, p.rank_in_file, columns), []).append(p.path)
        recorded = {name for p in parts for name, _ in p.columns}  # the columns some part holds
        frames = []
        target: pl.Schema | None = None
        for (rank, in_file, columns), files in groups.items():
            frame = scan_files(files)
            if not in_file:
                names = [name for name, _ in columns] or frame.collect_schema().names()
                anchor = "update" if table in UPDATE_TABLES else "step"
                at = names.index(anchor) + 1 if anchor in names else len(names)
                frame = frame.select(*names[:at], pl.lit(rank, pl.Int16).alias(RANK), *names[at:])
            if columns and columns != expected:
                if target is None:
                    target = pl.from_arrow(frame_schema(table, rules).empty_table()).schema  # type: ignore[union-attr]
                conformed = conform(frame, target, files, recorded)
                if conformed is None:
                    continue
                frame = conformed
            frames.append(frame)
        if not frames:
            return pl.from_arrow(frame_schema(table, rules).empty_table()).lazy()  # type: ignore[union-attr]
        out = frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")
        return with_derived(out) if table == "tokens" and self.sampled else out


def _readable_parts(path: Location, table: str, verify: bool) -> tuple[tuple[Part, ...], tuple[Location, ...]]:
    """The part files of `table` that read, in (rank, part) order, but those that a compacted
    part of their rank replaces (trustlens.run.compact), and those that did not read (each warned
    about)."""
    folder = path / table
    found: list[tuple[int, int, Location]] = []
    for name, is_dir in list_folder(folder):
        if name.startswith("."):
            continue
        rank = rank_of_dir(name) if is_dir else None
        if rank is None:
            warn(f"skipping {folder / name}: not a rank=R folder of part files (a stray copy?)")
            continue
        for file, file_is_dir in list_folder(folder / name):
            index = part_index(file)
            if index is not None and not file_is_dir:
                found.append((rank, index, folder / name / file))
            elif not file.startswith("."):  # hidden: a part file being written
                warn(f"skipping {folder / name / file}: not a part file (part-NNNNNN.parquet)")
    readable, unreadable = [], []
    replaced: set[tuple[int, int]] = set()  # (rank, index) of parts a compacted part replaces
    for rank, index, f in sorted(found, key=lambda x: x[:2]):
        try:
            meta = pq.read_metadata(source(f))
            version = int((meta.metadata or {}).get(META_SCHEMA_VERSION, b"0") or 0)
            if version <= SCHEMA_VERSION and verify:
                verify_pages(f)
        except (OSError, ValueError) as err:
            warn(f"skipping unreadable part file {f}: {err}", CorruptPartWarning)
            unreadable.append(f)
            continue
        if version > SCHEMA_VERSION:
            raise NotARunError(
                f"part file {f} was written with schema version {version}; this trustlens reads up "
                f"to version {SCHEMA_VERSION}: upgrade trustlens"
            )
        stamped = (meta.metadata or {}).get(META_WORLD_SIZE, b"")
        world_size = int(stamped) if stamped.isdigit() else None
        columns = column_key(meta.schema.to_arrow_schema())
        replaced.update((rank, i) for i, _ in replaced_indices(meta.metadata))
        readable.append((rank, index, Part(f, rank, RANK in meta.schema.names, columns, world_size)))
    return tuple(p for rank, index, p in readable if (rank, index) not in replaced), tuple(unreadable)


def _stand_in_manifest(parts: dict[str, tuple[Part, ...]]) -> dict[str, Any]:
    """What can be known of a run whose run.json is unreadable: its rules, from the columns."""
    tokens = parts["tokens"]
    names = pq.read_schema(source(tokens[0].path)).names if tokens else []
    rules: dict[str, dict[str, Any]] = {r: {} for r in (rule_of_column(n) for n in names) if r is not None}
    return {"schema_version": None, "status": "unknown", "rules": rules, "active_rule": None, "missing": []}


def load_run(path: str | os.PathLike | Remote, *, verify: bool = True) -> Run:
    """The run in directory `path` (or the directory of the run.json `path` names).

    verify: check the page checksums of part files not verified before in this process.
    Raises NotARunError (a ValueError) when `path` is not a run directory (naming the runs up
    to three folders below it, when it is a folder of runs) or was written with a newer schema
    version than this trustlens reads. An unreadable run.json is warned about and
    the run's parts still load (status `unknown`).
    """
    check_bool("verify", verify)
    location: Location
    if isinstance(path, Remote):
        location = path
    elif is_url(check_path("path", path)):
        location = Remote.of(os.fspath(path))
        if location.name == MANIFEST:
            location = Remote(location.fs, location.path.rsplit("/", 1)[0], location.protocol)
    else:
        location = local_path(path)
        if location.name == MANIFEST and location.is_file():
            location = location.parent
    try:
        manifest: dict[str, Any] | None = read_manifest(location)
    except NotARunError as err:
        raise naming_runs_inside(location, err) from None
    except ValueError as err:
        warn(f"{err}; loading its part files without it")
        manifest = None
    parts: dict[str, tuple[Part, ...]] = {}
    unreadable: dict[str, tuple[Location, ...]] = {}
    for table in TABLES:
        parts[table], unreadable[table] = _readable_parts(location, table, verify)
    lacking = [key for key in NEEDED_FIELDS if manifest is not None and key not in manifest]
    if manifest is not None and lacking:
        lost = "; ".join(f"{key}: {NEEDED_FIELDS[key]}" for key in lacking)
        warn(f"{location / MANIFEST} has no {', '.join(lacking)}; read without it ({lost})")
        manifest = {**_stand_in_manifest(parts), **manifest}
    _check_world_sizes(location, manifest, parts)
    return Run(path=location, manifest=manifest or _stand_in_manifest(parts), parts=parts, unreadable=unreadable)


def naming_runs_inside(folder: Location, err: NotARunError) -> NotARunError:
    """`err` (`folder` holds no run) extended with the runs below `folder` (up to three folders
    down), when it is a folder of runs: "give those instead (…)"; else `err` itself."""
    inside = _runs_inside(folder)
    if not inside:
        return err
    more = f", and {len(inside) - _SUGGESTED} more" if len(inside) > _SUGGESTED else ""
    runs = ", ".join(str(run) for run in inside[:_SUGGESTED])
    return NotARunError(f"{err}; it is a folder of {len(inside)} runs: give those instead ({runs}{more})")


def _check_world_sizes(location: Location, manifest: dict[str, Any] | None, parts: dict[str, tuple[Part, ...]]) -> None:
    """NotARunError naming both when the run's ranks were written with different world sizes
    (run.json's world_size and those stamped in the part files; parts written before the stamp
    are not compared)."""
    said = (manifest or {}).get("world_size")
    sizes: dict[int, str] = {said: str(location / MANIFEST)} if isinstance(said, int) else {}
    for part in (p for table in parts.values() for p in table):
        if part.world_size is not None:
            sizes.setdefault(part.world_size, str(part.path))
    if len(sizes) > 1:
        (first, where), (other, there) = list(sizes.items())[:2]
        raise NotARunError(
            f"run {str(location)!r} holds ranks written with different world sizes: world_size {first} "
            f"({where}) and world_size {other} ({there}); record each run with one world size"
        )


def load_runs(folder: str | os.PathLike, *, verify: bool = True) -> list[Run]:
    """Every run at or below `folder` (a directory holding run.json), sorted by path. Runs that
    cannot be loaded are skipped with a warning; table and hidden folders are not searched."""
    check_bool("verify", verify)
    location: Location
    if is_url(check_path("folder", folder)):
        location = Remote.of(os.fspath(folder))
    else:
        location = local_path(folder)
        if not location.is_dir():
            raise NotARunError(f"{str(location)!r} is not a directory")
    runs = []
    for path in _run_dirs(location):
        try:
            runs.append(load_run(path, verify=verify))
        except NotARunError as err:
            warnings.warn(f"skipping {path}: {err}", RunWarning, stacklevel=2)
    return sorted(runs, key=lambda r: str(r.path))


# how many folders deep below a folder that is not a run `load_run` looks for runs to name in
# its error, and how many of them it names
_SEARCH_DEPTH = 3
_SUGGESTED = 8


def _runs_inside(folder: Location) -> list[Location]:
    """The run directories below `folder` (at most _SEARCH_DEPTH folders down); [] when
    `folder` is itself a run (it holds run.json) or cannot be listed."""
    try:
        found = _run_dirs(folder, _SEARCH_DEPTH)
    except OSError:
        return []
    itself = str(folder).rstrip("/")
    return [] if any(str(run).rstrip("/") == itself for run in found) else found


def _run_dirs(folder: Location, depth: int | None = None) -> list[Location]:
    """The directories holding run.json at or below `folder` (at most `depth` folders down;
    None: any), sorted by path; table and hidden folders are not searched."""
    found: list[Location] = []
    if isinstance(folder, Remote):
        for key in folder.fs.find(folder.path, maxdepth=None if depth is None else depth + 1):
            parts = key[len(folder.path) :].strip("/").split("/")
            if parts[-1] == MANIFEST and not any(p in TABLES or p.startswith(".") for p in parts[:-1]):
                found.append(Remote(folder.fs, key.rsplit("/", 1)[0], folder.protocol))
        return sorted(found, key=str)
    for root, dirs, names in os.walk(folder):
        deep = depth is not None and len(Path(root).relative_to(folder).parts) >= depth
        dirs[:] = [] if deep else [d for d in dirs if not d.startswith(".")]
        if MANIFEST in names:
            dirs[:] = [d for d in dirs if d not in TABLES]
            found.append(Path(root))
    return sorted(found, key=str)
