"""TensorBoard event files read without TensorFlow: the TFRecord frames and the `Event` protos
of the `tensorboard` package (`tensorboard.compat.proto.event_pb2`).

A frame is: length (uint64, little-endian), the masked CRC-32C of those 8 bytes (uint32), the
record, the masked CRC-32C of the record (uint32). The length's CRC is checked (a frame whose
length is garbage is corruption, not a huge record) for every frame parsed with the proto; the
record's is not (it would cost more than the parse, and a damaged record fails to parse). A
frame cut short at the end of a file is one still being written: `EventFile.read` stops before
it and reads it on the next call.

Values read: scalars as TensorBoard's own writers store them — `simple_value` (torch's
SummaryWriter, tensorboardX, TF1) or a one-element float/double/int tensor (TF2's
`tf.summary.scalar`, plugin "scalars") — and text summaries (plugin "text": tensorboardX's
`add_text`) as strings. Images, histograms and the like are skipped.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

EVENT_PREFIX = "events.out.tfevents."  # the name every TensorBoard event file starts with

_HEADER = struct.Struct("<QI")
_FLOAT = struct.Struct("<f")


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
class Values:
    """Values read from event files, in the order read: scalars in three lists, texts by tag."""

    steps: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    texts: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # tag -> (step, text)


@dataclass
class EventFile:
    """One event file, read from where the last `read` stopped (a file being written is read
    again as it grows)."""

    path: Path
    offset: int = 0  # bytes read so far: the start of the next frame
    _shapes: dict[bytes, str] = field(default_factory=dict, repr=False)  # an event's bytes after its step -> its tag

    def read(self, into: Values | None = None) -> Values:
        """The scalars and texts of the frames written since the last call, appended to `into`
        (default: a new Values); raises CorruptEventFile (naming the file and the offset) on a
        bad frame, having appended none of the file's values.

        Fast path: a scalar event is `09 wall_time 10 step <rest> value`, where <rest> (the
        summary's framing, the tag, the simple_value key) is the same bytes for every event of
        one tag and step width. The first event of each tag is parsed with the proto and its
        <rest> remembered; a later record whose bytes match one exactly is read without the
        proto (its frame's length is then right too). Anything else is parsed with the proto,
        its frame's length CRC checked."""
        from google.protobuf.message import DecodeError
        from tensorboard.compat.proto import event_pb2

        out = Values() if into is None else into
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        pos, end = 0, len(data)
        event = event_pb2.Event()
        unpack, value_at, shapes = _HEADER.unpack_from, _FLOAT.unpack_from, self._shapes
        steps: list[int] = []
        names: list[str] = []
        values: list[float] = []
        other = Values()  # tensors: texts and TF2's scalars
        while pos + 12 <= end:
            length, crc = unpack(data, pos)
            a = pos + 12
            b = a + length
            rest = -1  # where the bytes after the step start, in a record shaped as the fast path reads
            if b + 4 <= end and length > 11 and data[a] == 9 and data[a + 9] == 16:
                i, step = a + 10, 0
                for shift in range(0, 64, 7):
                    c = data[i]
                    step |= (c & 127) << shift
                    i += 1
                    if c < 128:
                        break
                rest = i
                tag = shapes.get(data[i : b - 4])
                if tag is not None:
                    steps.append(step)
                    names.append(tag)
                    values.append(value_at(data, b - 4)[0])
                    pos = b + 4
                    continue
            if masked_crc32c(data[pos : pos + 8]) != crc:
                raise CorruptEventFile(f"{self.path}: bad frame at byte {self.offset + pos} (length CRC mismatch)")
            if b + 4 > end:
                break  # being written: read it next time
            try:
                event.ParseFromString(data[a:b])
            except DecodeError as err:
                raise CorruptEventFile(f"{self.path}: unreadable record at byte {self.offset + pos}: {err}") from None
            value = event.summary.value
            one = len(value) == 1 and value[0].WhichOneof("value") == "simple_value"
            if one and rest > 0 and data[b - 5] == 0x15 and event.step >= 0:
                shapes[data[rest : b - 4]] = value[0].tag
            for v in value:
                if v.WhichOneof("value") == "simple_value":
                    steps.append(event.step)
                    names.append(v.tag)
                    values.append(v.simple_value)
                else:
                    _tensor(other, event.step, v)
            pos = b + 4
        out.steps += steps + other.steps
        out.names += names + other.names
        out.values += values + other.values
        for tag, items in other.texts.items():
            out.texts.setdefault(tag, []).extend(items)
        self.offset += pos
        return out


def _tensor(out: Values, step: int, v) -> None:
    """A tensor value: a text (plugin "text"), or a one-element number (TF2's scalars)."""
    if v.WhichOneof("value") != "tensor":
        return
    t = v.tensor
    plugin = v.metadata.plugin_data.plugin_name
    if plugin == "text" or t.string_val:
        if t.string_val:
            out.texts.setdefault(v.tag, []).append((step, t.string_val[0].decode("utf-8", "replace")))
        return
    for numbers in (t.float_val, t.double_val, t.int64_val, t.int_val):
        if len(numbers) == 1:
            out.steps.append(step)
            out.names.append(v.tag)
            out.values.append(float(numbers[0]))
            return
    dtype = {1: "<f", 2: "<d", 3: "<i", 9: "<q"}.get(t.dtype)
    if plugin == "scalars" and dtype is not None and len(t.tensor_content) == struct.calcsize(dtype):
        out.steps.append(step)
        out.names.append(v.tag)
        out.values.append(float(struct.unpack(dtype, t.tensor_content)[0]))


def event_files(folder: Path) -> list[Path]:
    """The event files in `folder` and below, sorted by path (TensorBoard's file names start
    with the writer's start time, so one writer's files sort in the order written)."""
    found = []
    for root, _dirs, files in os.walk(folder):
        found += [Path(root) / f for f in files if f.startswith(EVENT_PREFIX)]
    return sorted(found)


__all__ = ["EVENT_PREFIX", "CorruptEventFile", "EventFile", "Values", "event_files", "masked_crc32c"]
