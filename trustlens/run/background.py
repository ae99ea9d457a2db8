"""The writer thread: a `RankWriter` behind a bounded queue.

`BackgroundWriter.put_*` returns at once unless the queue is full; the caller never waits longer
than `writer_timeout` seconds (then a `WriterError`). An error in the thread is kept, written to
run.json (`failed`) and raised in the caller at its next call; a bad input the thread finds (a
job that raises `RejectedInputError`) drops that call's rows and is raised at the caller's next
call, the run going on. `interrupt` (SIGTERM, SIGINT: trustlens.run.interrupts) writes everything
queued and ends the run `interrupted`.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from trustlens.run.errors import RejectedInputError, WriterError
from trustlens.run.parts import TokenBatch
from trustlens.run.writer import RankWriter, WriterStats, describe_error

# how often the writer thread looks for an interrupt while idle, seconds
POLL_SECONDS = 0.05


class BackgroundWriter:
    """A thread that writes one rank of a run through a `RankWriter` (see the module docstring)."""

    def __init__(
        self,
        writer: RankWriter,
        *,
        flush_seconds: float,
        queue_size: int,
        writer_timeout: float,
        taps: Sequence[Any] = (),
    ) -> None:
        """`taps`: objects with `add(table, batch)`, `end_step(step)` and `close()` that see every
        batch of rows this thread writes, on this thread, are told when the recorder ends a step,
        and are closed before the last rows are written, so that rows they append go in (the live
        mirror of trustlens.export, the live alerts of trustlens.live). With the writer's
        `flush_steps`, every buffered row is written at each `end_step`, after the taps judged the
        step (a follower, `trustlens watch` or the dashboard, sees a step within seconds of its
        end, not `flush_seconds` later)."""
        self.writer, self.path = writer, writer.path
        self.taps = tuple(taps)
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

    def end_step(self, step: int) -> None:
        """Tell the taps, in order with the rows, that every row of `step` was given (and, with
        `flush_steps`, write the rows)."""
        if self.taps or self.writer.flush_steps:
            self._put(("end_step", step))

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
                self._end("failed", describe_error(err))
                raise
        if self.error is not None:
            self._thread.join(self.writer_timeout)  # it ends the run `failed` itself
            self._end("failed", describe_error(self.error))
        elif signal is not None or isinstance(error, KeyboardInterrupt):
            self._end("interrupted", None if error is None else describe_error(error), signal or "SIGINT")
        else:
            self._end("finished" if error is None else "failed", None if error is None else describe_error(error))
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
                    self._close_taps()
                    self._write_all()
                    self.writer.compact_parts()
                    return
                self._handle(kind, payload)
        except BaseException as err:  # kept and raised in the caller's thread
            self.error = err
            self._end("failed", describe_error(err))

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "flush":
            self._write_all()
            payload.set()
        elif kind == "manifest":
            self.writer.update_manifest(payload)
        elif kind == "end_step":
            for tap in self.taps:
                tap.end_step(payload)
            if self.writer.flush_steps:
                self._write_all()
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
        self._close_taps()
        self._write_all()

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
            for tap in self.taps:
                tap.add(name, rows)
        if not self.writer.buffered:
            self._oldest = None

    def _write_all(self) -> None:
        self.writer.write_all()
        self._oldest = None

    def _close_taps(self) -> None:
        for tap in self.taps:
            tap.close()
