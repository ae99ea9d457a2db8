"""Following a run while it is written: `RunFollower.poll()` returns the steps completed since
the last poll, reading only the part files written since then.

What a poll reads. Part files are numbered from 0 per (table, rank) and never change once
written (docs/run-format.md), so the follower keeps, per (table, rank), the number of the next
part it expects and asks only for that file (and the ones after it, while they exist): one
existence check per (table, rank) and poll, whatever the run's length, plus run.json (and a
listing of the folder until its first part is read: a compacted run's parts start past 0). A
compacted part (trustlens.run.compact, written as a sampled run closes) holds the rows of the
parts it replaces again: only those of the parts not read before are taken. A part
still being written has a hidden temporary name locally and does not exist yet on an object store
(one upload of the whole object), so a poll never reads one. Each new part is read once, with its
page checksums checked (`verify`); a part that does not read is skipped with a
`CorruptPartWarning`, as `load_run` does. When the run closes, one listing of every folder picks
up a part a gap in the numbers would have hidden.

When a step is complete. Ranks write independently and a step may be split over several part
files, so a step S is complete once every rank has written token rows of a later step, seen at the
previous poll already (a writer's flush writes the tokens part before the samples and metrics
parts of the same flush: the poll in between would miss them), or once the run is closed
(status other than `running`): then every step read is complete. Rows for a step already
returned (a table the writer kept buffered after the later step's tokens were written) are not
returned again; `late_rows` counts them. The rows of the `alerts` table (the alerts a recorder
raised live, trustlens.live) are not per step: each poll returns those it read.

Memory: the rows of steps not yet complete, and a few numbers per (table, rank).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from trustlens.core.argument_checks import check_bool, check_path
from trustlens.run.compact import replaced_indices
from trustlens.run.errors import CorruptPartWarning, NotARunError
from trustlens.run.manifest import CLOSED, MANIFEST, read_manifest
from trustlens.run.parts import Location, list_folder, rank_folder, source
from trustlens.run.reader import naming_runs_inside
from trustlens.run.schema import RANK, TABLES, UPDATE_TABLES, part_index, part_name, rank_of_dir
from trustlens.run.storage import Remote, is_url, local_path

# tables whose rows are events, returned as read rather than per step
EVENT_TABLES = ("alerts",)
# seconds without a change after which a run on an object store (no writer lock to ask) that
# still says `running` is taken as stopped (`writer_died`; `trustlens watch --stale`)
STALE_SECONDS = 900.0


@dataclass(frozen=True)
class CompletedStep:
    """The rows of one completed step, from every rank (a `rank` column, as `load_run` gives),
    as the part files hold them (a sampled run's ratio and binary divergences are null there:
    `Run.tokens` and the live monitor derive them). A table without rows for the step is an
    empty frame (no columns when the run never wrote that table)."""

    step: int
    tokens: pl.DataFrame  # one row per (update, rank, sample, position)
    samples: pl.DataFrame  # one row per (rank, sample)
    metrics: pl.DataFrame  # one row per (rank, metric name)
    aggregates: pl.DataFrame  # a sampled run: one row per record call; else empty


@dataclass(frozen=True)
class FollowUpdate:
    """What one poll found."""

    steps: list[CompletedStep]  # the steps that became complete, in step order
    alerts: pl.DataFrame  # rows of the run's alerts table read by this poll (empty: none)


@dataclass
class FollowState:
    """What the follower has seen so far (updated by each poll)."""

    manifest: dict[str, Any] = field(default_factory=dict)  # run.json at the last poll
    parts_read: int = 0  # part files read, all tables and ranks
    tokens: int = 0  # trained tokens in the parts read (a sampled run: from its exact aggregates)
    last_step: int | None = None  # the largest step with token rows read
    last_complete: int | None = None  # the last step returned by `poll`
    late_rows: int = 0  # rows read for a step already returned (not returned again)

    @property
    def status(self) -> str:
        """run.json's status: running, finished, stopped, interrupted, failed (unknown when unreadable)."""
        return str(self.manifest.get("status", "unknown"))

    @property
    def closed(self) -> bool:
        """Whether the run is closed (status finished, stopped, interrupted or failed)."""
        return self.status in CLOSED


def updated_seconds_ago(manifest: dict[str, Any], now: float | None = None) -> float | None:
    """Seconds since run.json's `updated` time (the last part file or status change); None when
    it holds none that parses."""
    try:
        stamp = datetime.fromisoformat(str(manifest["updated"]))
    except (KeyError, ValueError):
        return None
    return max(0.0, (time.time() if now is None else now) - stamp.timestamp())


def writer_alive(path: Location) -> bool | None:
    """Whether a writer holds rank 0 of the local run `path` open: its lock file is locked (the
    kernel releases the lock when the holder dies). None on an object store (no locks there) or
    without a lock file. Asks with a shared non-blocking lock, held for no longer than the
    question."""
    if isinstance(path, Remote):
        return None
    try:
        fd = os.open(path / ".rank=0.lock", os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing the descriptor releases a lock it took
    return False


def writer_died(
    path: Location, manifest: dict[str, Any], *, stale: float = STALE_SECONDS, now: float | None = None
) -> str | None:
    """Why the run at `path` is taken as stopped although its run.json (`manifest`) still says
    `running` (a writer killed by SIGKILL, a crashed job, a lost machine): "no writer holds it"
    when the rank-0 writer lock of a local run is free (`writer_alive`), or "nothing changed for
    over S s" on an object store (no locks there) once run.json's `updated` is older than `stale`
    seconds. None when run.json says another status (the run closed) or a writer may still be
    writing. The one test of a dead writer: `trustlens watch` (which asks twice, a poll apart,
    before it exits 3), `trustlens doctor` and the dashboard use it."""
    if manifest.get("status") != "running":
        return None
    alive = writer_alive(path)
    if alive is False:
        return "no writer holds it"
    ago = updated_seconds_ago(manifest, now)
    if alive is None and ago is not None and ago > stale:
        return f"nothing changed for over {stale:g} s"
    return None


def run_location(path: str | os.PathLike | Remote) -> Location:
    """The run directory `path` names: a local folder (a path or file:// URL) or an object-store
    location; a path to run.json names its folder."""
    if isinstance(path, Remote):
        return path
    if is_url(check_path("path", path)):
        location: Location = Remote.of(os.fspath(path))
    else:
        location = local_path(path)
    if location.name == MANIFEST:
        location = (
            Remote(location.fs, location.path.rsplit("/", 1)[0], location.protocol)
            if isinstance(location, Remote)
            else location.parent
        )
    return location


class RunFollower:
    """Follows the run at `path` while it is written (see the module docstring).

    path: a run directory or object-store URL. Raises NotARunError when it holds no run.json.
    verify: check each new part file's page checksums (as `load_run(verify=True)`).
    """

    def __init__(self, path: str | os.PathLike | Remote, *, verify: bool = True) -> None:
        check_bool("verify", verify)
        self.path = run_location(path)
        self.verify = verify
        try:
            self.state = FollowState(manifest=read_manifest(self.path))
        except NotARunError as err:
            raise naming_runs_inside(self.path, err) from None
        self._next: dict[tuple[str, int], int] = {}  # (table, rank) -> number of the next part
        self._rows: dict[tuple[str, int], dict[int, int]] = {}  # (table, rank) -> {part read: its rows}
        self._watermark: dict[int, int] = {}  # rank -> largest step of its token rows read
        self._complete_before: int | None = None  # steps below it were complete at the last poll
        self._pending: dict[int, dict[str, list[pl.DataFrame]]] = {}  # step -> table -> rows
        self._events: list[pl.DataFrame] = []  # rows of EVENT_TABLES read by this poll
        self._swept = False

    @property
    def world_size(self) -> int:
        return max(1, int(self.state.manifest.get("world_size") or 1))

    @property
    def done(self) -> bool:
        """Whether the run is closed and every step of it has been returned."""
        return self._swept and not self._pending

    def poll(self) -> FollowUpdate:
        """Read run.json and the part files written since the last poll; return the steps that
        became complete, in step order (each step once over the follower's life), and the alert
        rows read."""
        with contextlib.suppress(ValueError, OSError):  # mid-replace or unreadable: keep the last one
            self.state.manifest = read_manifest(self.path)
        closed = self.state.closed  # read before the parts: a closed run's parts are all there
        for table in TABLES:
            for rank in range(self.world_size):
                self._read_new(table, rank)
        if closed and not self._swept:
            self._sweep()
            self._swept = True
        ready = self._complete_before
        lowest = min((self._watermark.get(r, -1) for r in range(self.world_size)), default=-1)
        self._complete_before = lowest
        steps = sorted(s for s in self._pending if closed or (ready is not None and s < ready))
        out = [self._step_rows(s, self._pending.pop(s)) for s in steps]
        if out:
            self.state.last_complete = out[-1].step
        events, self._events = self._events, []
        alerts = pl.concat(events, how="diagonal_relaxed") if events else pl.DataFrame()
        return FollowUpdate(out, alerts)

    def _read_new(self, table: str, rank: int) -> None:
        """Read the parts of (table, rank) from the next expected number on, while they exist."""
        folder = rank_folder(self.path, table, rank)
        index = self._next.get((table, rank), 0)
        if not self._rows.get((table, rank)) and not _exists(folder / part_name(index)):
            # nothing read yet and no part 0: a compacted run's parts start later
            index = min((i for f, d in list_folder(folder) if not d and (i := part_index(f)) is not None), default=0)
        while _exists(folder / part_name(index)):
            self._read_part(table, rank, folder / part_name(index))
            index += 1
        self._next[(table, rank)] = index

    def _sweep(self) -> None:
        """List every folder of the closed run once: read any part past a gap in the numbers (and
        a rank folder beyond `world_size`)."""
        for table in TABLES:
            for name, is_dir in list_folder(self.path / table):
                rank = rank_of_dir(name) if is_dir else None
                if rank is None:
                    continue
                folder = self.path / table / name
                start = self._next.get((table, rank), 0)
                found = sorted(
                    i for f, d in list_folder(folder) if not d and (i := part_index(f)) is not None and i >= start
                )
                for i in found:
                    self._read_part(table, rank, folder / part_name(i))
                if found:
                    self._next[(table, rank)] = found[-1] + 1

    def _read_part(self, table: str, rank: int, path: Location) -> None:
        try:
            arrow = pq.ParquetFile(source(path), page_checksum_verification=self.verify).read()
        except (OSError, ValueError) as err:
            warnings.warn(f"skipping unreadable part file {path}: {err}", CorruptPartWarning, stacklevel=4)
            return
        arrow = self._unread_rows(table, rank, path, arrow)
        frame = pl.from_arrow(arrow)
        assert isinstance(frame, pl.DataFrame)
        if RANK not in frame.columns:  # schema 2: the rank is the folder's
            names = frame.columns
            after = "update" if table in UPDATE_TABLES else "step"  # where `load_run` puts it
            at = names.index(after) + 1 if after in names else len(names)
            frame = frame.select(*names[:at], pl.lit(rank, pl.Int16).alias(RANK), *names[at:])
        self.state.parts_read += 1
        if table in EVENT_TABLES:
            self._events.append(frame)
            return
        sampled = "keep" in self.state.manifest
        if (table == "tokens" and not sampled) or table == "aggregates":
            self.state.tokens += frame.height if table == "tokens" else int(frame["tokens"].sum() or 0)
        if table == "tokens" and frame.height:
            high = int(frame["step"].max())  # type: ignore[arg-type]
            self._watermark[rank] = max(high, self._watermark.get(rank, high))
            self.state.last_step = max(high, self.state.last_step if self.state.last_step is not None else high)
        done = self.state.last_complete
        for (step,), rows in frame.partition_by("step", as_dict=True, maintain_order=True).items():
            if done is not None and int(step) <= done:
                self.state.late_rows += rows.height
                continue
            self._pending.setdefault(int(step), {}).setdefault(table, []).append(rows)

    def _unread_rows(self, table: str, rank: int, path: Location, arrow: pa.Table) -> pa.Table:
        """The rows of part `path` not read before: a compacted part (trustlens.run.compact) holds
        the rows of the parts it replaces in part order, and those already read are left out."""
        read = self._rows.setdefault((table, rank), {})
        replaces = replaced_indices(arrow.schema.metadata)
        kept, start = [], 0
        for index, rows in replaces:
            if index not in read:
                kept.append(arrow.slice(start, rows))
            read[index] = rows
            start += rows
        read[part_index(path.name) or 0] = arrow.num_rows
        if not replaces:
            return arrow
        return pa.concat_tables([*kept, arrow.slice(start)]) if kept else arrow.slice(start)

    def _step_rows(self, step: int, tables: dict[str, list[pl.DataFrame]]) -> CompletedStep:
        def joined(table: str) -> pl.DataFrame:
            frames = tables.get(table)
            if not frames:
                return pl.DataFrame()
            return frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")

        return CompletedStep(step, joined("tokens"), joined("samples"), joined("metrics"), joined("aggregates"))


def _exists(path: Location) -> bool:
    """Whether the file `path` exists now (an object store is asked, not its listing cache)."""
    if isinstance(path, Path):
        return path.is_file()
    path.fs.invalidate_cache(path.path)
    return bool(path.fs.exists(path.path))


__all__ = [
    "STALE_SECONDS",
    "CompletedStep",
    "FollowState",
    "FollowUpdate",
    "RunFollower",
    "run_location",
    "updated_seconds_ago",
    "writer_alive",
    "writer_died",
]
