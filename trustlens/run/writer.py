"""The one writer of the run format: part files, the rank lock, run.json, the background thread.

`RankWriter` owns one rank of a run directory. Opening it takes an OS file lock on
`RUN/.rank=R.lock` (released by the kernel when the holder dies), refuses a directory that
already holds this rank's rows unless `resume=True` (same run_id, steps continue) or
`overwrite=True` (this rank's rows and, on rank 0, run.json are replaced), and on rank 0 writes
run.json. It buffers rows per table and writes them as numbered part files of at most
`rows_per_file` rows, or sooner once a table's buffer holds `PART_BYTES` (long sample texts).
Every part file is written under a hidden temporary name, fsynced and renamed (`write_part`), so
a killed process leaves only complete files, and a failed write leaves no temporary file.

`BackgroundWriter` runs a `RankWriter` in a thread behind a bounded queue: `put` returns at once
unless the queue is full; the caller never waits longer than `writer_timeout` seconds (then a
`WriterError`). An error in the thread is kept, written to run.json (`failed`) and raised in the
caller at its next call. `interrupt` (signals) writes everything queued and ends the run
`interrupted`.

TokenRecorder, the synthetic generator and the sample-run builder all write through here.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import queue
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trustlens.run.aggregates import aggregates_batch
from trustlens.run.errors import RejectedInputError, RunLockedError, WriterError
from trustlens.run.manifest import MANIFEST, STATUSES, read_manifest, utc_now, write_json_atomic
from trustlens.run.schema import RANK_DIR_PREFIX, TABLES, part_index, part_name, table_schema
from trustlens.run.storage import Remote, is_url, local_path

# where a run lives: a local directory or a location on an object store
Location = Path | Remote

# Parquet compression of part files: zstd writes as fast as snappy here and ~10% smaller.
COMPRESSION = "zstd"
# Rows per Parquet row group: rows are sorted by step, so readers skip row groups of other steps.
ROW_GROUP_ROWS = 65_536
# Columns with few distinct values per file get Parquet dictionary encoding; the float
# quantities are nearly all distinct, and trying a dictionary on them costs about half of the
# write time for a larger file.
DICTIONARY_COLUMNS = ("step", "update", "sample", "group", "pos", "token_id", "token", "advantage", "name", "prompt")
# how often the writer thread looks for an interrupt while idle, seconds
POLL_SECONDS = 0.05


STATISTICS_COLUMNS = ("step", "update", "sample", "group", "pos")


def write_options(schema: pa.Schema) -> dict[str, Any]:
    """The `pq.write_table` options of a part file with `schema` (page checksums on)."""
    return {
        "compression": COMPRESSION,
        "use_dictionary": [c for c in DICTIONARY_COLUMNS if c in schema.names],
        "write_page_checksum": True,
        "row_group_size": ROW_GROUP_ROWS,
        # min/max statistics of the key columns only: readers prune row groups by step (and
        # sample); statistics of every other column would only grow each file's footer
        "write_statistics": [c for c in STATISTICS_COLUMNS if c in schema.names],
    }


def rank_folder(root: Location, table: str, rank: int) -> Location:
    """The folder of `table`'s part files written by `rank`."""
    return root / table / f"{RANK_DIR_PREFIX}{rank}"


def write_part(table: pa.Table, directory: Location, index: int) -> Location:
    """Write `table` as part file `index` in `directory` (a RUN/<table>/rank=R folder),
    atomically: locally a hidden temporary file, fsynced, then renamed (on any error the
    temporary file is removed and the error raised); on an object store one upload of the
    complete object."""
    if isinstance(directory, Remote):
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, **write_options(table.schema))
        remote = directory / part_name(index)
        remote.write_bytes(sink.getvalue().to_pybytes())
        return remote
    final = Path(directory) / part_name(index)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            pq.write_table(table, f, **write_options(table.schema))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


@dataclass
class TokenBatch:
    """The rows of one `record` call as compact CPU arrays: one entry per valid position."""

    step: int  # training step of every row
    update: int  # update within the step of every row
    sample: np.ndarray  # (N,) int64 sample ids
    group: np.ndarray  # (N,) int64 group ids
    pos: np.ndarray  # (N,) int positions in the response (cast to int32 by the writer)
    token_id: np.ndarray  # (N,) int sampled token ids (cast to int32 by the writer)
    floats: dict[str, np.ndarray | None]  # float column -> (N,) float32; None = null column
    blocked: dict[str, np.ndarray | None]  # rule -> (N,) bool; None = rule not evaluable
    aggregates: dict[str, Any] | None = None  # a sampled recording: the aggregates of all the call's rows

    def __len__(self) -> int:
        return len(self.pos)


def token_record_batch(batch: TokenBatch, schema: pa.Schema) -> pa.RecordBatch:
    """The Arrow rows of `batch` in the columns of `schema`, without the `token` column (added
    per part file, dictionary-encoded)."""
    n = len(batch)
    given = {
        "step": np.full(n, batch.step, np.int32),
        "update": np.full(n, batch.update, np.int16),
        "sample": batch.sample,
        "group": batch.group,
        "pos": batch.pos,
        "token_id": batch.token_id,
        **batch.floats,
        **{f"blocked_{rule}": v for rule, v in batch.blocked.items()},
    }
    arrays, fields = [], []
    for field in schema:
        if field.name == "token":
            continue
        value = given.get(field.name)
        arrays.append(pa.nulls(n, field.type) if value is None else pa.array(value, field.type))
        fields.append(field)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


@dataclass
class WriterStats:
    """What the writer did so far (read from the caller's thread; values are monotone)."""

    rows_written: int = 0  # token rows in complete part files
    files_written: int = 0  # part files of all tables
    peak_buffered_rows: int = 0  # most token rows held in the buffer at once
    blocked_seconds: float = 0.0  # time callers waited on a full queue


class TokenDecoder:
    """Token id -> text, decoding each id once (a cache) with `tokenizer.decode`; None without
    a tokenizer. The text is untrusted model output: stored as is, to be rendered as text."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def dictionary_column(self, token_ids: pa.ChunkedArray) -> pa.ChunkedArray:
        """The `token` column for `token_ids`: dictionary-encoded, one entry per distinct id,
        one dictionary shared by all chunks."""
        if self.tokenizer is None:
            return pa.chunked_array([pa.nulls(len(token_ids), pa.dictionary(pa.int32(), pa.string()))])
        encoded = pc.dictionary_encode(token_ids)  # hash-based; its chunks share one dictionary
        ids = encoded.chunk(0).dictionary.to_pylist() if encoded.num_chunks else []
        missing = [i for i in ids if i not in self.cache]
        if missing:
            batch_decode = getattr(self.tokenizer, "batch_decode", None)
            if batch_decode is not None:
                texts = batch_decode([[i] for i in missing])
            else:
                texts = [self.tokenizer.decode([i]) for i in missing]
            self.cache.update(zip(missing, texts, strict=True))
        dictionary = pa.array([self.cache[i] for i in ids], pa.string())
        return pa.chunked_array(
            [pa.DictionaryArray.from_arrays(c.indices, dictionary) for c in encoded.chunks],
            pa.dictionary(pa.int32(), pa.string()),
        )


PART_BYTES = 256 << 20  # a table's buffer is written as a part file once it holds this many bytes


class PartFiles:
    """One table's rows of one rank: a buffer of record batches written as numbered part files."""

    def __init__(self, run_dir: Location, table: str, rank: int, schema: pa.Schema, next_index: int) -> None:
        self.run_dir, self.table, self.rank, self.schema = run_dir, table, rank, schema
        self.batches: list[pa.RecordBatch] = []
        self.rows = 0
        self.nbytes = 0  # Arrow buffer bytes of the buffered batches
        self.next_index = next_index

    def append(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)
        self.rows += batch.num_rows
        self.nbytes += batch.nbytes

    def _sorted_by_step(self) -> bool:
        """Whether the buffered rows are already in step order (the usual case: one step per
        batch, batches in step order), so that no sort is needed."""
        last = None
        for batch in self.batches:
            lo, hi = pc.min_max(batch.column("step")).values()
            if lo.as_py() != hi.as_py() or (last is not None and lo.as_py() < last):
                return False
            last = hi.as_py()
        return True

    def write(self, decoder: TokenDecoder) -> Location:
        """Write the buffered rows, sorted by step (stably), as the next part file; empty the buffer."""
        table = pa.Table.from_batches(self.batches)
        if not self._sorted_by_step():
            table = table.take(pc.sort_indices(table, [("step", "ascending")]))
        if self.table == "tokens" and "token" not in table.column_names:
            token = decoder.dictionary_column(table.column("token_id"))
            table = table.add_column(self.schema.get_field_index("token"), "token", token)
        for field in self.schema:  # a nullable column the rows do not carry (e.g. `weight`) is null
            if field.nullable and field.name not in table.column_names:
                table = table.append_column(field.name, pa.nulls(table.num_rows, field.type))
        table = table.select(self.schema.names).cast(self.schema)
        path = write_part(table, rank_folder(self.run_dir, self.table, self.rank), self.next_index)
        self.next_index += 1
        self.batches, self.rows, self.nbytes = [], 0, 0
        return path


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


def list_folder(folder: Location) -> list[tuple[str, bool]]:
    """(name, is a folder) of the entries of `folder`, sorted by name; [] when it does not exist."""
    if isinstance(folder, Remote):
        return sorted(folder.listdir())
    if not folder.is_dir():
        return []
    return sorted((e.name, e.is_dir()) for e in os.scandir(folder))


def source(path: Location) -> Any:
    """What pyarrow reads `path` from: the path, or an open object-store file."""
    return path.open() if isinstance(path, Remote) else path


def _existing_parts(run_dir: Location, rank: int) -> dict[str, list[Location]]:
    """This rank's part files per table, in part order."""
    out = {}
    for table in TABLES:
        folder = rank_folder(run_dir, table, rank)
        out[table] = [folder / n for n, is_dir in list_folder(folder) if not is_dir and part_index(n) is not None]
    return out


def _last_step(files: list[Location]) -> int | None:
    """The largest `step` in part files, from their row-group statistics (footers only)."""
    last = None
    for f in files:
        meta = pq.read_metadata(source(f))
        column = meta.schema.names.index("step")
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(column).statistics
            if stats is not None and stats.has_min_max:
                last = max(stats.max, last) if last is not None else stats.max
    return last


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
        self.rank, self.rows_per_file = rank, rows_per_file
        self.stats = WriterStats()
        self._decoder = TokenDecoder(tokenizer)
        try:
            self.manifest, self.last_step, next_index = self._open(manifest, resume, overwrite)
        except BaseException:
            if self._lock is not None:
                self._lock.release()
            raise
        self._parts = {t: PartFiles(self.path, t, rank, table_schema(t, rules), next_index[t]) for t in TABLES}
        self.write_manifest()

    def _open(
        self, manifest: dict[str, Any] | None, resume: bool, overwrite: bool
    ) -> tuple[dict[str, Any] | None, int | None, dict[str, int]]:
        """(run.json to keep writing, last recorded step when resuming, next part index per table)."""
        for table in TABLES:  # temporary files of a killed writer of this rank (we hold the lock)
            folder = rank_folder(self.path, table, self.rank)
            for tmp in folder.glob(".part-*.tmp") if isinstance(folder, Path) and folder.is_dir() else ():
                tmp.unlink()
        parts = _existing_parts(self.path, self.rank)
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
        if manifest is not None and run_json is not None:
            old = read_manifest(self.path)
            old.update(status="running", error=None, signal=None)
            old["resumed"] = [*old.get("resumed", []), utc_now()]
            for key in ("rules", "active_rule", "world_size", "flush"):
                old[key] = manifest[key]
            if old.get("schema_version") != manifest["schema_version"]:
                raise ValueError(
                    f"run_dir {str(self.path)!r} was written with schema version "
                    f"{old.get('schema_version')}; resume it with the trustlens that wrote it"
                )
            manifest = old
        last = max((s for s in (_last_step(files) for files in parts.values()) if s is not None), default=None)
        next_index = {t: (part_index(files[-1].name) or 0) + 1 if files else 0 for t, files in parts.items()}
        return manifest, last, next_index

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

    def token_batches(self, batch: TokenBatch) -> list[tuple[str, pa.RecordBatch]]:
        """The (table, rows) a `record` call's TokenBatch becomes: its token rows and, for a
        sampled recording, its row of the aggregates table. Append each with `append`."""
        out = []
        if batch.aggregates is not None:
            schema = self._parts["aggregates"].schema
            out.append(("aggregates", aggregates_batch(batch.aggregates, batch.step, batch.update, schema)))
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
        written (call `write_all` first)."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        try:
            self.update_manifest({"status": status, "error": error, "signal": signal})
        finally:
            if self._lock is not None:
                self._lock.release()

    def close(self, status: str = "finished") -> None:
        """Write every buffered row, then end the run with `status`."""
        try:
            self.write_all()
        except BaseException as err:
            self.end("failed", _describe(err))
            raise
        self.end(status)


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


class BackgroundWriter:
    """A thread that writes one rank of a run through a `RankWriter` (see the module docstring)."""

    def __init__(
        self,
        writer: RankWriter,
        *,
        flush_seconds: float,
        queue_size: int,
        writer_timeout: float,
        tap: Any | None = None,
    ) -> None:
        """`tap`: an object with `add(table, batch)` and `close()` that sees every batch of rows
        this thread writes, on this thread, and is closed when the writer stops (the live
        mirror of trustlens.export)."""
        self.writer, self.path = writer, writer.path
        self.tap = tap
        self.flush_seconds, self.writer_timeout = flush_seconds, writer_timeout
        self.error: BaseException | None = None
        self.rejected: list[RejectedInputError] = []  # bad inputs found, not yet raised
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._oldest: float | None = None  # monotonic time of the oldest buffered row
        self._interrupt: str | None = None  # set (a signal name) by `interrupt`
        self._ended = False
        self._end_lock = threading.Lock()  # one final status, whichever thread ends the run
        self._thread = threading.Thread(target=self._run, name=f"trustlens-writer-{writer.rank}", daemon=True)
        self._thread.start()

    @property
    def stats(self) -> WriterStats:
        return self.writer.stats

    # ---- caller side ----

    def put_tokens(self, batch: TokenBatch | Callable[[], TokenBatch]) -> None:
        """Queue the rows of a `record` call, or a function computing them, run by the thread."""
        self._put(("tokens", batch))

    def put_table(self, table: str, batch: pa.RecordBatch) -> None:
        self._put((table, batch))

    def put_manifest(self, fields: dict[str, Any]) -> None:
        """Merge `fields` into run.json (no-op on ranks that don't write it)."""
        if self.writer.manifest is not None:
            self._put(("manifest", fields))

    def flush(self) -> None:
        """Block until everything put so far is in complete part files; then raise a rejected
        input, if any."""
        done = threading.Event()
        self._put(("flush", done))
        self._wait(done.wait, "write the rows recorded so far")
        self.raise_rejected()

    def close(self, error: BaseException | None = None, signal: str | None = None) -> None:
        """Write everything still queued or buffered, stop the thread and end run.json as
        `finished`, `interrupted` (a `signal`, or `error` a KeyboardInterrupt) or `failed`
        (`error`, or the writer's own error, which is then raised)."""
        try:
            if self.error is None and self._thread.is_alive():
                self._put(("stop", None))
                self._wait(self._joined, "finish writing")
        except WriterError as err:
            if self.error is None:  # stuck: the thread cannot end the run itself
                self._end("failed", _describe(err))
                raise
        if self.error is not None:
            self._thread.join(self.writer_timeout)  # it ends the run `failed` itself
            self._end("failed", _describe(self.error))
        elif signal is not None or isinstance(error, KeyboardInterrupt):
            self._end("interrupted", None if error is None else _describe(error), signal or "SIGINT")
        else:
            self._end("finished" if error is None else "failed", None if error is None else _describe(error))
        self.raise_error()
        if error is None:
            self.raise_rejected()

    def interrupt(self, signal: str) -> None:
        """From a signal handler: write every row queued so far and end the run `interrupted`,
        waiting at most `writer_timeout` seconds. Takes no lock the interrupted code may hold."""
        if self._ended:
            return
        self._interrupt = signal
        self._thread.join(self.writer_timeout)
        self._end("interrupted" if self.error is None else "failed", None, signal)

    def raise_rejected(self) -> None:
        """Raise (once) the RejectedInputError of the first call whose rows the thread dropped
        since the last raise, saying how many more were dropped."""
        if not self.rejected:
            return
        rejected, self.rejected = self.rejected, []
        if len(rejected) == 1:
            raise rejected[0]
        raise RejectedInputError(f"{rejected[0]}; and {len(rejected) - 1} later call(s) were dropped too")

    def raise_error(self) -> None:
        if self.error is not None:
            raise WriterError(f"the trustlens writer of {self.path} failed: {self.error!r}") from self.error

    def _end(self, status: str, error: str | None, signal: str | None = None) -> None:
        """End the run once; a second caller waits (bounded) until the first has ended it."""
        if not self._end_lock.acquire(timeout=self.writer_timeout):
            return
        try:
            if self._ended:
                return
            self._ended = True
            # run.json may not be writable (the disk that failed): the rows are what counts
            with contextlib.suppress(OSError):
                self.writer.end(status, error, signal)
        finally:
            self._end_lock.release()

    def _put(self, item: tuple[str, Any]) -> None:
        self.raise_error()
        try:
            self._queue.put_nowait(item)
            return
        except queue.Full:
            pass
        start = time.perf_counter()
        try:
            self._wait(lambda timeout: self._try_put(item, timeout), "accept more rows")
        finally:
            self.writer.stats.blocked_seconds += time.perf_counter() - start

    def _try_put(self, item: tuple[str, Any], timeout: float) -> bool:
        try:
            self._queue.put(item, timeout=timeout)
            return True
        except queue.Full:
            return False

    def _joined(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _wait(self, attempt: Callable[[float], bool], what: str) -> None:
        """Retry `attempt(timeout)` until it succeeds; raise the writer's error if it dies, and a
        WriterError once `writer_timeout` seconds have passed."""
        deadline = time.monotonic() + self.writer_timeout
        while not attempt(min(0.2, self.writer_timeout)):
            self.raise_error()
            if not self._thread.is_alive():
                raise WriterError(f"the trustlens writer of {self.path} stopped")
            if time.monotonic() >= deadline:
                raise WriterError(
                    f"the trustlens writer of {self.path} did not {what} within writer_timeout="
                    f"{self.writer_timeout:g} s: is the disk full, slow or hung?"
                )

    # ---- writer thread ----

    def _run(self) -> None:
        try:
            while True:
                if self._interrupt is not None:
                    self._drain()
                    return
                due = math.inf if self._oldest is None else self._oldest + self.flush_seconds - time.monotonic()
                try:
                    kind, payload = self._queue.get(timeout=max(0.0, min(POLL_SECONDS, due)))
                except queue.Empty:
                    if due <= 0:
                        self._write_all()
                    continue
                if kind == "stop":
                    self._write_all()
                    self._close_tap()
                    return
                self._handle(kind, payload)
        except BaseException as err:  # kept and raised in the caller's thread
            self.error = err
            self._end("failed", _describe(err))

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "flush":
            self._write_all()
            payload.set()
        elif kind == "manifest":
            self.writer.update_manifest(payload)
        else:
            self._buffer(kind, payload)

    def _drain(self) -> None:
        """Write every row queued or buffered (the process is being interrupted)."""
        while True:
            try:
                kind, payload = self._queue.get_nowait()
            except queue.Empty:
                break
            if kind != "stop":
                self._handle(kind, payload)
        self._write_all()
        self._close_tap()

    def _buffer(self, table: str, payload: TokenBatch | Callable[[], TokenBatch] | pa.RecordBatch) -> None:
        if callable(payload):
            try:
                payload = payload()
            except RejectedInputError as err:  # that call's rows are dropped; the run goes on
                self.rejected.append(err)
                return
        batches = self.writer.token_batches(payload) if isinstance(payload, TokenBatch) else [(table, payload)]
        for name, rows in batches:
            if rows.num_rows and self._oldest is None:
                self._oldest = time.monotonic()
            self.writer.append(name, rows)
            if self.tap is not None:
                self.tap.add(name, rows)
        if not self.writer.buffered:
            self._oldest = None

    def _write_all(self) -> None:
        self.writer.write_all()
        self._oldest = None

    def _close_tap(self) -> None:
        if self.tap is not None:
            self.tap.close()
