"""Reads back the history a W&B run logged offline: the run's `.wandb` file is a log of
protobuf `Record`s in LevelDB's log format (32 KiB blocks; each fragment has a 7-byte header:
CRC32C, length, type FULL/FIRST/MIDDLE/LAST), after a 7-byte file header (":W&B", magic, version).
A test-only reader, so that the tests check what W&B stored, not what trustlens meant to send."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        body = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            out.append(body)
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        elif kind == LAST:
            out.append(pending + body)
        elif kind == 0 and length == 0:
            break
    return out


def history(run_dir: Path) -> dict[int, dict[str, object]]:
    """{step: {key: value}} of every history record of the offline run in `run_dir`.

    W&B's service process may still be writing the file when `finish()` returns (seen under load
    with wandb 0.31): wait for the run's `exit` record, which it writes after the history."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    (file,) = run_dir.glob("run-*.wandb")
    deadline = time.monotonic() + 60
    while True:
        parsed = []
        for raw in records(file):
            record = pb.Record()
            try:
                record.ParseFromString(raw)
            except DecodeError:  # a record still being written
                break
            parsed.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in parsed) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    steps: dict[int, dict[str, object]] = {}
    for record in parsed:
        if record.WhichOneof("record_type") != "history":
            continue
        items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
        step = int(items.pop("_step", record.history.step.num))
        steps.setdefault(step, {}).update(items)
    return steps
