"""TensorBoard event files read without TensorFlow: the TFRecord frames and the `Event` protos
of the `tensorboard` package (`tensorboard.compat.proto.event_pb2`).

A frame is: length (uint64, little-endian), the masked CRC-32C of those 8 bytes (uint32), the
record, the masked CRC-32C of the record (uint32). The length's CRC is checked (a frame whose
length is garbage is corruption, not a huge record); the record's is not (it would cost more
than the parse, and a damaged record fails to parse). A frame cut short at the end of a file is
one still being written: `EventFile.read` stops before it and reads it on the next call.

Values read: scalars as TensorBoard's own writers store them — `simple_value` (torch's
SummaryWriter, tensorboardX, TF1) or a one-element float/double/int tensor (TF2's
`tf.summary.scalar`, plugin "scalars") — and text summaries (plugin "text": tensorboardX's
`add_text`) as strings. Images, histograms and the like are skipped.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

EVENT_PREFIX = "events.out.tfevents."  # the name every TensorBoard event file starts with

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")


def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C (Castagnoli) of `data`."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class CorruptEventFile(ValueError):
    """An event file whose frames or records cannot be read."""


@dataclass
class EventFile:
    """One event file, read from where the last `read` stopped (a file being written is read
    again as it grows)."""

    path: Path
    offset: int = 0  # bytes read so far: the start of the next frame
    _checked: dict[bytes, bool] = field(default_factory=dict, repr=False)  # header -> its CRC matched

    def read(self) -> Iterator[tuple[int, float, str, float | str]]:
        """(step, wall_time, tag, value) of each scalar and text in the frames written since the
        last call; raises CorruptEventFile (naming the file and the offset) on a bad frame."""
        from google.protobuf.message import DecodeError
        from tensorboard.compat.proto import event_pb2

        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        pos, end = 0, len(data)
        event = event_pb2.Event()
        while pos + 12 <= end:
            header = data[pos : pos + 12]
            length, crc = _HEADER.unpack(header)
            ok = self._checked.get(header)
            if ok is None:
                ok = self._checked[header] = masked_crc32c(header[:8]) == crc
            if not ok:
                raise CorruptEventFile(f"{self.path}: bad frame at byte {self.offset + pos} (length CRC mismatch)")
            stop = pos + 12 + length + 4
            if stop > end:
                break  # being written: read it next time
            try:
                event.ParseFromString(data[pos + 12 : pos + 12 + length])
            except DecodeError as err:
                raise CorruptEventFile(f"{self.path}: unreadable record at byte {self.offset + pos}: {err}") from None
            pos = stop
            if event.HasField("summary"):
                yield from _values(event)
        self.offset += pos


def _values(event) -> Iterator[tuple[int, float, str, float | str]]:
    step, wall = int(event.step), float(event.wall_time)
    for v in event.summary.value:
        kind = v.WhichOneof("value")
        if kind == "simple_value":
            yield step, wall, v.tag, float(v.simple_value)
        elif kind == "tensor":
            t = v.tensor
            plugin = v.metadata.plugin_data.plugin_name
            if plugin == "text" or t.string_val:
                if t.string_val:
                    yield step, wall, v.tag, t.string_val[0].decode("utf-8", "replace")
            elif len(t.float_val) == 1:
                yield step, wall, v.tag, float(t.float_val[0])
            elif len(t.double_val) == 1:
                yield step, wall, v.tag, float(t.double_val[0])
            elif len(t.int64_val) == 1:
                yield step, wall, v.tag, float(t.int64_val[0])
            elif len(t.int_val) == 1:
                yield step, wall, v.tag, float(t.int_val[0])
            elif t.tensor_content and plugin == "scalars":
                dtype = {1: "<f", 2: "<d", 3: "<i", 9: "<q"}.get(t.dtype)
                if dtype is not None and len(t.tensor_content) == struct.calcsize(dtype):
                    yield step, wall, v.tag, float(struct.unpack(dtype, t.tensor_content)[0])


def event_files(folder: Path) -> list[Path]:
    """The event files in `folder` and below, sorted by path (TensorBoard's file names start
    with the writer's start time, so one writer's files sort in the order written)."""
    found = []
    for root, _dirs, files in os.walk(folder):
        found += [Path(root) / f for f in files if f.startswith(EVENT_PREFIX)]
    return sorted(found)


__all__ = ["EVENT_PREFIX", "CorruptEventFile", "EventFile", "event_files", "masked_crc32c"]
