"""The one writer of the run format: the rank lock, one rank's part files and run.json.

`RankWriter` owns one rank of a run directory. Opening it takes an OS file lock on
`RUN/.rank=R.lock` (released by the kernel when the holder dies), refuses a directory that
already holds this rank's rows unless `resume=True` (same run_id, steps continue) or
`overwrite=True` (this rank's rows and, on rank 0, run.json are replaced), and on rank 0 writes
run.json. It buffers rows per table and writes them as numbered part files of at most
`rows_per_file` rows, or sooner once a table's buffer holds `PART_BYTES` (long sample texts),
each written atomically (`trustlens.run.parts.write_part`). With `compact`, closing it merges its
small part files (`trustlens.run.compact`).

`trustlens.run.background.BackgroundWriter` runs a `RankWriter` in a thread. TokenRecorder, the
synthetic generator and the sample-run builder all write through here.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from trustlens.run.aggregates import aggregates_batch
from trustlens.run.compact import compact_parts, remove_replaced
from trustlens.run.errors import RunLockedError
from trustlens.run.manifest import MANIFEST, STATUSES, read_manifest, utc_now, write_json_atomic
from trustlens.run.parts import (
    PART_BYTES,
    Location,
    PartFiles,
    TokenBatch,
    TokenDecoder,
    existing_parts,
    last_step,
    rank_folder,
    token_record_batch,
    written_world_size,
)
from trustlens.run.routes import routing_batch
from trustlens.run.schema import META_WORLD_SIZE, TABLES, part_index, table_schema
from trustlens.run.storage import Remote, is_url, local_path


@dataclass
class WriterStats:
    """What the writer did so far (read from the caller's thread; values are monotone)."""

    rows_written: int = 0  # token rows in complete part files
    files_written: int = 0  # part files of all tables
    peak_buffered_rows: int = 0  # most token rows held in the buffer at once
    blocked_seconds: float = 0.0  # time callers waited on a full queue


class RankLock:
    """An exclusive OS lock (flock) on `RUN/.rank=R.lock`, holding the holder's pid and host.
    Two opens conflict even within one process; the kernel releases it when the holder dies."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.path = run_dir / f".rank={rank}.lock"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _lock_holder(fd)
            os.close(fd)
            raise RunLockedError(
                f"run_dir {str(run_dir)!r} rank {rank} is being written by {holder}; "
                f"one writer per rank (lock file {self.path})"
            ) from None
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": utc_now()}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, info, 0)
        self.fd: int | None = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _lock_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {info['pid']} on host {info['host']} (since {info['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another writer"


class RankWriter:
    """One rank of a run directory opened for writing (see the module docstring).

    run_dir: the run directory (created), or an object-store URL (trustlens.run.storage; no
        lock there).
    rank / world_size: this writer's rank and the run's number of ranks.
    rules: rule names of the `blocked_<rule>` token columns.
    manifest: rank 0: run.json for a new run (`trustlens.run.manifest.new_manifest`); other
        ranks: None (they never write run.json).
    rows_per_file: rows of one table per part file (the bound of the buffer, with PART_BYTES).
    tokenizer: decodes `token_id` to the `token` column when rows come without it.
    resume / overwrite: how to open a run that already holds rows of this rank.
    flush_steps: the buffered rows are written at each step's end (`BackgroundWriter.end_step`).
    compact: when the run closes, merge each table's part files of this rank into as few as
        `COMPACT_BYTES` allows (`compact_parts`); None: when the rank wrote an aggregates table
        (a sampled run, whose parts are small).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        rank: int,
        world_size: int,
        rules: list[str],
        manifest: dict[str, Any] | None,
        rows_per_file: int,
        tokenizer: Any | None = None,
        resume: bool = False,
        overwrite: bool = False,
        flush_steps: bool = False,
        compact: bool | None = None,
    ) -> None:
        if resume and overwrite:
            raise ValueError("resume and overwrite are exclusive: continue the run or replace it")
        self.path: Location = Remote.of(os.fspath(run_dir)) if is_url(run_dir) else local_path(run_dir)
        self._lock: RankLock | None = None
        if isinstance(self.path, Path):
            if self.path.exists() and not self.path.is_dir():
                raise ValueError(f"run_dir {str(self.path)!r} exists and is not a directory")
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock = RankLock(self.path, rank)
        self.rank, self.world_size, self.rows_per_file = rank, world_size, rows_per_file
        self.flush_steps, self.compact = flush_steps, compact
        self.stats = WriterStats()
        self._decoder = TokenDecoder(tokenizer)
        try:
            self.manifest, self.last_step, next_index = self._open(manifest, resume, overwrite)
        except BaseException:
            if self._lock is not None:
                self._lock.release()
            raise
        self._parts = {t: PartFiles(self.path, t, rank, self._schema(t, rules), next_index[t]) for t in TABLES}
        self.write_manifest()

    def _schema(self, table: str, rules: list[str]) -> pa.Schema:
        """`table`'s part schema, its metadata stamped with this writer's world size."""
        schema = table_schema(table, rules)
        return schema.with_metadata({**(schema.metadata or {}), META_WORLD_SIZE: str(self.world_size).encode()})

    def _open(
        self, manifest: dict[str, Any] | None, resume: bool, overwrite: bool
    ) -> tuple[dict[str, Any] | None, int | None, dict[str, int]]:
        """(run.json to keep writing, last recorded step when resuming, next part index per table)."""
        for table in TABLES:  # temporary files of a killed writer of this rank (we hold the lock)
            folder = rank_folder(self.path, table, self.rank)
            for tmp in folder.glob(".part-*.tmp") if isinstance(folder, Path) and folder.is_dir() else ():
                tmp.unlink()
        if resume:  # parts a writer killed while compacting left beside the part that replaces them
            remove_replaced(self.path, self.rank)
        parts = existing_parts(self.path, self.rank)
        held = [p for files in parts.values() for p in files]
        run_json = self.path / MANIFEST if manifest is not None and (self.path / MANIFEST).exists() else None
        if overwrite:
            for table in TABLES:
                folder = rank_folder(self.path, table, self.rank)
                if isinstance(folder, Remote):
                    folder.remove_tree()
                else:
                    shutil.rmtree(folder, ignore_errors=True)
            return manifest, None, dict.fromkeys(TABLES, 0)
        if not resume:
            if held or run_json is not None:
                what = f"{len(held)} part files of rank {self.rank}" if held else MANIFEST
                raise FileExistsError(
                    f"run_dir {str(self.path)!r} already holds a run ({what}); pass resume=True to "
                    "continue it (same run_id, later steps) or overwrite=True to replace it"
                )
            return manifest, None, dict.fromkeys(TABLES, 0)
        old = read_manifest(self.path) if manifest is not None and run_json is not None else None
        # the world size of this rank's last part of each table, and run.json's: one number
        stamped = (written_world_size(files[-1]) for files in parts.values() if files)
        written = {self.world_size, *(n for n in stamped if n is not None)}
        if old is not None and isinstance(old.get("world_size"), int):
            written.add(old["world_size"])
        if len(written) > 1:
            raise ValueError(
                f"world_size {self.world_size} differs from the world size the run in {str(self.path)!r} "
                f"was recorded with ({', '.join(map(str, sorted(written - {self.world_size})))}): resume it "
                "with the same number of ranks, or record a new run"
            )
        last = max((s for s in (last_step(files) for files in parts.values()) if s is not None), default=None)
        if old is not None and manifest is not None:
            old.update(status="running", error=None, signal=None, stopped=None)
            old["resumed"] = [*old.get("resumed", []), utc_now()]
            old["resumed_after"] = [*old.get("resumed_after", []), last]
            for key in ("rules", "active_rule", "world_size", "flush"):
                old[key] = manifest[key]
            if old.get("schema_version") != manifest["schema_version"]:
                raise ValueError(
                    f"run_dir {str(self.path)!r} was written with schema version "
                    f"{old.get('schema_version')}; resume it with the trustlens that wrote it"
                )
            manifest = old
        next_index = {t: (part_index(files[-1].name) or 0) + 1 if files else 0 for t, files in parts.items()}
        return manifest, last, next_index

    def check_tokenizer(self, token_id: int) -> None:
        """Decode `token_id` now (the recorder's first call): a tokenizer that gives anything but
        one str per id raises TypeError naming it here, not later in the writer thread. Another
        error of the tokenizer (an id it does not know) is left to the writer, which fails the run
        with it."""
        if self._decoder.tokenizer is None or not 0 <= token_id < 2**31:
            return
        try:
            self._decoder.decode([token_id])
        except TypeError:
            raise
        except Exception:  # reported by the writer, which fails the run with it
            return

    @property
    def run_id(self) -> str | None:
        return None if self.manifest is None else self.manifest.get("run_id")

    def append(self, table: str, batch: pa.RecordBatch | pa.Table) -> None:
        """Buffer rows of `table` (without `rank`); writes a part file when the buffer is full."""
        if batch.num_rows == 0:
            return
        parts = self._parts[table]
        for b in batch.to_batches() if isinstance(batch, pa.Table) else [batch]:
            parts.append(b)
        if table == "tokens":
            self.stats.peak_buffered_rows = max(self.stats.peak_buffered_rows, parts.rows)
        if parts.rows >= self.rows_per_file or parts.nbytes >= PART_BYTES:
            self._write(parts)
            self.write_manifest()

    def append_now(self, table: str, batch: pa.RecordBatch | pa.Table) -> None:
        """Buffer rows of `table` and write the table's buffered rows as a part file at once, with
        run.json (an alert: rare, and read by `trustlens watch` and the dashboard within seconds)."""
        self.append(table, batch)
        parts = self._parts[table]
        if parts.rows:
            self._write(parts)
            self.write_manifest()

    def token_batches(self, batch: TokenBatch) -> list[tuple[str, pa.RecordBatch]]:
        """The (table, rows) a `record` call's TokenBatch becomes: its token rows, for a sampled
        recording its row of the aggregates table, and with routed experts its rows of the
        routing table (sampled or not). Append each with `append`."""
        out = []
        if batch.aggregates is not None:
            schema = self._parts["aggregates"].schema
            out.append(("aggregates", aggregates_batch(batch.aggregates, batch.step, batch.update, schema)))
        if batch.routing is not None and batch.routes is not None:
            k = batch.routes.mu.shape[1]
            schema = self._parts["routing"].schema
            out.append(("routing", routing_batch(batch.routing, k, batch.step, batch.update, schema)))
        out.append(("tokens", token_record_batch(batch, self._parts["tokens"].schema)))
        return out

    @property
    def buffered(self) -> bool:
        return any(p.rows for p in self._parts.values())

    def write_all(self) -> None:
        """Write every buffered row as part files."""
        wrote = False
        for parts in self._parts.values():
            if parts.rows:
                self._write(parts)
                wrote = True
        if wrote:
            self.write_manifest()

    def compact_parts(self) -> None:
        """With `compact`, merge this rank's part files of each table (`trustlens.run.compact`);
        call after `write_all`, when no more rows come."""
        sampled = self._parts["aggregates"].next_index > 0  # an aggregates part was written (or resumed)
        if not (sampled if self.compact is None else self.compact):
            return
        next_index = {t: p.next_index for t, p in self._parts.items()}
        written = compact_parts(self.path, self.rank, {t: p.schema for t, p in self._parts.items()}, next_index)
        for table, parts in self._parts.items():
            parts.next_index = next_index[table]
        if written:
            self.stats.files_written += written
            self.write_manifest()

    def _write(self, parts: PartFiles) -> None:
        rows = parts.rows
        parts.write(self._decoder)
        self.stats.files_written += 1
        if parts.table == "tokens":
            self.stats.rows_written += rows

    def update_manifest(self, fields: dict[str, Any]) -> None:
        """Merge `fields` into run.json (rank 0; other ranks have none)."""
        if self.manifest is not None:
            self.manifest.update(fields)
            self.write_manifest()

    def write_manifest(self) -> None:
        if self.manifest is not None:
            self.manifest["updated"] = utc_now()
            write_json_atomic(self.path / MANIFEST, self.manifest)

    def end(self, status: str, error: str | None = None, signal: str | None = None) -> None:
        """Set run.json's final status (rank 0) and release the lock; buffered rows are not
        written (call `write_all` first). A run that ends `finished` after its trainer stopped it
        on a live alert (run.json `stopped` set, trustlens.live.stop) ends `stopped`."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        if status == "finished" and self.manifest is not None and self.manifest.get("stopped"):
            status = "stopped"
        try:
            self.update_manifest({"status": status, "error": error, "signal": signal})
        finally:
            if self._lock is not None:
                self._lock.release()

    def close(self, status: str = "finished") -> None:
        """Write every buffered row, then end the run with `status`."""
        try:
            self.write_all()
            self.compact_parts()
        except BaseException as err:
            self.end("failed", describe_error(err))
            raise
        self.end(status)


def describe_error(err: BaseException) -> str:
    """One line naming an error's type and message (run.json's `error`)."""
    return f"{type(err).__name__}: {err}"
