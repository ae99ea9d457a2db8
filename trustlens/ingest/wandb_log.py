"""W&B runs without the network: an offline run's `.wandb` file (the record log W&B writes under
`wandb/offline-run-*/run-*.wandb`, what `wandb sync` uploads) and the history a user exported to
CSV or JSON.

The `.wandb` file is LevelDB's log format (github.com/google/leveldb, doc/log_format.md) after a
7-byte header (":W&B", magic 0xBEE1, version 0): 32 KiB blocks of chunks, each chunk a CRC-32
(zlib) of its type and data (uint32), its length (uint16), its type (FULL 1, FIRST 2, MIDDLE 3,
LAST 4) and its data; a record is one FULL chunk or FIRST, MIDDLE…, LAST. Each record is a
`wandb.proto.wandb_internal_pb2.Record`; the `history` records hold one `wandb.log` call each
(items with a key and a JSON value; `_step` the step).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_BLOCK = 32768
_CHUNK = struct.Struct("<IHB")
_HEADER = b":W&B\xe1\xbe\x00"


class CorruptWandbFile(ValueError):
    """A `.wandb` file whose header or chunks cannot be read."""


def _records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    if not data.startswith(_HEADER[:4]):
        raise CorruptWandbFile(f"{path}: not a W&B run file (no ':W&B' header)")
    pos, pending = len(_HEADER), b""
    while pos + _CHUNK.size <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK.size:  # the block's trailer
            pos += left
            continue
        crc, length, kind = _CHUNK.unpack_from(data, pos)
        chunk = data[pos + _CHUNK.size : pos + _CHUNK.size + length]
        if length == 0 and kind == 0:  # zero padding
            pos += left
            continue
        if len(chunk) < length:
            break  # a file still being written
        if zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF != crc:
            raise CorruptWandbFile(f"{path}: bad chunk at byte {pos} (CRC mismatch)")
        pos += _CHUNK.size + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk
            pending = b""
        else:
            raise CorruptWandbFile(f"{path}: unknown chunk type {kind} at byte {pos}")


def wandb_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(step, {key: value}) of each `wandb.log` call in a `.wandb` file, values decoded from JSON
    (nested keys joined with '/')."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
    for data in _records(path):
        try:
            record.ParseFromString(data)
        except DecodeError as err:
            raise CorruptWandbFile(f"{path}: unreadable record: {err}") from None
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in record.history.item:
            key = "/".join(item.nested_key) if item.nested_key else item.key
            try:
                row[key] = json.loads(item.value_json)
            except ValueError:
                row[key] = item.value_json
        step = row.pop("_step", record.history.step.num)
        yield int(step), {k: v for k, v in row.items() if not k.startswith("_")}


def history_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(step, {column: value}) of an exported W&B history: a CSV with a `_step` (or `step`)
    column, or JSON (a list of rows, or JSON lines), as `run.history()` / the UI export it."""
    if path.suffix.lower() == ".csv":
        import csv

        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                yield _step_of(row, path), {k: _csv_value(v) for k, v in row.items() if k and not k.startswith("_")}
        return
    text = path.read_text()
    rows = (
        json.loads(text)
        if text.lstrip().startswith("[")
        else [json.loads(line) for line in text.splitlines() if line.strip()]
    )
    for row in rows:
        yield _step_of(row, path), {k: v for k, v in row.items() if not k.startswith("_") and k != "step"}


def _step_of(row: dict[str, Any], path: Path) -> int:
    step = row.get("_step", row.get("step"))
    try:
        return int(float(step))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(
            f"{path}: a row without a numeric _step or step column ({step!r}): export the history with _step"
        ) from None


def _csv_value(text: str | None) -> Any:
    if text is None or text == "":
        return None
    try:
        return float(text)
    except ValueError:
        return text


__all__ = ["CorruptWandbFile", "history_rows", "wandb_rows"]
