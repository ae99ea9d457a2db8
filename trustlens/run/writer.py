"""The background writer of a recorded run: buffers rows and writes them as Parquet part files.

The recorder hands each batch of rows to `BackgroundWriter.put`, which returns at once unless the
bounded queue is full (the only time the training step waits on the writer). A single thread
turns batches into Arrow, buffers them per table up to `rows_per_file` rows, and writes a part
file when the buffer is full, when the oldest buffered row is `flush_seconds` old, on `flush()`
and on `close()`. Memory is therefore bounded by `queue_size` batches plus `rows_per_file` rows
per table, however long the run.

Each part file is written under a hidden temporary name, synced and renamed when complete, so a
process killed at any moment leaves only complete files (DESIGN §4) and loses at most the rows
still buffered or queued. An exception in the thread is kept and raised in the caller on its next
call to `put`, `flush` or `close`.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trustlens.run.schema import MANIFEST, part_path, table_schema

# Parquet compression of part files: zstd writes as fast as snappy here and ~10% smaller.
COMPRESSION = "zstd"
# Columns with few distinct values per file get Parquet dictionary encoding; the float
# quantities are nearly all distinct, and trying a dictionary on them costs about half of the
# write time for a larger file.
DICTIONARY_COLUMNS = (
    "step",
    "update",
    "rank",
    "sample",
    "group",
    "pos",
    "token_id",
    "token",
    "advantage",
    "name",
    "prompt",
)


def write_options(schema: pa.Schema) -> dict[str, Any]:
    """The `pq.write_table` options of a part file with `schema`."""
    return {"compression": COMPRESSION, "use_dictionary": [c for c in DICTIONARY_COLUMNS if c in schema.names]}


def utc_now() -> str:
    """The current UTC time, ISO 8601 with seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, obj: dict[str, Any]) -> None:
    """Write `obj` as JSON to `path` so that readers only ever see a complete file."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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

    def __len__(self) -> int:
        return len(self.pos)


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
            self.cache.update(zip(missing, texts))
        dictionary = pa.array([self.cache[i] for i in ids], pa.string())
        return pa.chunked_array(
            [pa.DictionaryArray.from_arrays(c.indices, dictionary) for c in encoded.chunks],
            pa.dictionary(pa.int32(), pa.string()),
        )


class PartFiles:
    """One table's rows of one rank: a buffer of record batches written as numbered part files."""

    def __init__(self, run_dir: Path, table: str, rank: int, schema: pa.Schema) -> None:
        self.run_dir, self.table, self.rank, self.schema = run_dir, table, rank, schema
        self.batches: list[pa.RecordBatch] = []
        self.rows = 0
        self.next_index = 0
        part_path(run_dir, table, rank, 0).parent.mkdir(parents=True, exist_ok=True)

    def append(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)
        self.rows += batch.num_rows

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

    def write(self, decoder: TokenDecoder) -> Path:
        """Write the buffered rows, sorted by step (stably), as the next part file; empty the buffer."""
        table = pa.Table.from_batches(self.batches)
        if not self._sorted_by_step():
            table = table.take(pc.sort_indices(table, [("step", "ascending")]))
        if self.table == "tokens":
            token = decoder.dictionary_column(table.column("token_id"))
            table = table.add_column(self.schema.get_field_index("token"), "token", token)
        table = table.cast(self.schema)
        path = part_path(self.run_dir, self.table, self.rank, self.next_index)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            pq.write_table(table, f, row_group_size=max(table.num_rows, 1), **write_options(self.schema))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.next_index += 1
        self.batches, self.rows = [], 0
        return path


def token_record_batch(batch: TokenBatch, rank: int, schema: pa.Schema) -> pa.RecordBatch:
    """The Arrow rows of `batch` in the columns of `schema`, without the `token` column (added
    per part file, dictionary-encoded)."""
    n = len(batch)
    given = {
        "step": np.full(n, batch.step, np.int32),
        "update": np.full(n, batch.update, np.int16),
        "rank": np.full(n, rank, np.int16),
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


class WriterError(RuntimeError):
    """The background writer failed; raised in the caller's thread on its next call."""


class BackgroundWriter:
    """A thread that writes the tables of one rank of a run (see the module docstring)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        rank: int,
        rules: list[str],
        tokenizer: Any | None,
        rows_per_file: int,
        flush_seconds: float,
        queue_size: int,
        manifest: dict[str, Any] | None,
    ) -> None:
        self.run_dir, self.rank = run_dir, rank
        self.rows_per_file, self.flush_seconds = rows_per_file, flush_seconds
        # the run's manifest when this rank writes it (rank 0), else None; owned by the thread
        # while it runs
        self.manifest = manifest
        self.stats = WriterStats()
        self.error: BaseException | None = None
        self._decoder = TokenDecoder(tokenizer)
        self._parts = {t: PartFiles(run_dir, t, rank, table_schema(t, rules)) for t in ("tokens", "samples", "metrics")}
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._oldest: float | None = None  # monotonic time of the oldest buffered row
        self._write_manifest()
        self._thread = threading.Thread(target=self._run, name=f"trustlens-writer-{rank}", daemon=True)
        self._thread.start()

    # ---- caller side ----

    def put_tokens(self, batch: TokenBatch | Callable[[], TokenBatch]) -> None:
        """Queue the rows of a `record` call, or a function computing them, run by the thread."""
        self._put(("tokens", batch))

    def put_table(self, table: str, batch: pa.RecordBatch) -> None:
        self._put((table, batch))

    def put_manifest(self, fields: dict[str, Any]) -> None:
        """Merge `fields` into run.json (no-op on ranks that don't write it)."""
        if self.manifest is not None:
            self._put(("manifest", fields))

    def flush(self) -> None:
        """Block until everything put so far is in complete part files."""
        done = threading.Event()
        self._put(("flush", done))
        self._wait(done.wait)

    def close(self, error: BaseException | None = None) -> None:
        """Write everything still buffered, stop the thread and end run.json as `finished`, or
        `failed` with `error` (the caller's) or the writer's own error, which is then raised."""
        try:
            if self.error is None and self._thread.is_alive():
                self._put(("stop", None))
                self._wait(self._joined)
        except WriterError:
            pass  # self.error is set: reported below
        failure = error if error is not None else self.error
        if self.manifest is not None:
            self.manifest["status"] = "finished" if failure is None else "failed"
            self.manifest["error"] = None if failure is None else f"{type(failure).__name__}: {failure}"
            self._write_manifest()
        self.raise_error()

    def raise_error(self) -> None:
        if self.error is not None:
            raise WriterError(f"the trustlens writer of {self.run_dir} failed: {self.error!r}") from self.error

    def _put(self, item: tuple[str, Any]) -> None:
        self.raise_error()
        try:
            self._queue.put_nowait(item)
            return
        except queue.Full:
            pass
        start = time.perf_counter()
        try:
            self._wait(lambda timeout: self._try_put(item, timeout))
        finally:
            self.stats.blocked_seconds += time.perf_counter() - start

    def _try_put(self, item: tuple[str, Any], timeout: float) -> bool:
        try:
            self._queue.put(item, timeout=timeout)
            return True
        except queue.Full:
            return False

    def _joined(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _wait(self, attempt: Callable[[float], bool]) -> None:
        """Retry `attempt(timeout)` until it succeeds, raising the writer's error if it dies."""
        while not attempt(0.2):
            self.raise_error()
            if not self._thread.is_alive():
                raise WriterError(f"the trustlens writer of {self.run_dir} stopped")

    # ---- writer thread ----

    def _run(self) -> None:
        try:
            while True:
                timeout = (
                    None if self._oldest is None else max(0.0, self._oldest + self.flush_seconds - time.monotonic())
                )
                try:
                    kind, payload = self._queue.get(timeout=timeout)
                except queue.Empty:
                    self._write_all()
                    continue
                if kind == "stop":
                    self._write_all()
                    return
                if kind == "flush":
                    self._write_all()
                    payload.set()
                elif kind == "manifest":
                    self.manifest.update(payload)
                    self._write_manifest()
                else:
                    self._buffer(kind, payload)
        except BaseException as err:  # kept and raised in the caller's thread
            self.error = err

    def _buffer(self, table: str, payload: TokenBatch | pa.RecordBatch) -> None:
        parts = self._parts[table]
        if callable(payload):
            payload = payload()
        if isinstance(payload, TokenBatch):
            payload = token_record_batch(payload, self.rank, parts.schema)
        if payload.num_rows == 0:
            return
        parts.append(payload)
        if self._oldest is None:
            self._oldest = time.monotonic()
        if table == "tokens":
            self.stats.peak_buffered_rows = max(self.stats.peak_buffered_rows, parts.rows)
        if parts.rows >= self.rows_per_file:
            self._write(parts)
            if not any(p.rows for p in self._parts.values()):
                self._oldest = None
            self._write_manifest()

    def _write_all(self) -> None:
        wrote = False
        for parts in self._parts.values():
            if parts.rows:
                self._write(parts)
                wrote = True
        self._oldest = None
        if wrote:
            self._write_manifest()

    def _write(self, parts: PartFiles) -> None:
        rows = parts.rows
        parts.write(self._decoder)
        self.stats.files_written += 1
        if parts.table == "tokens":
            self.stats.rows_written += rows

    def _write_manifest(self) -> None:
        if self.manifest is not None:
            self.manifest["updated"] = utc_now()
            write_json_atomic(self.run_dir / MANIFEST, self.manifest)
