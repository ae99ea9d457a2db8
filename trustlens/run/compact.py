"""Compaction: a closing writer merges its rank's small part files of each table into fewer.

Every part file has a footer (the Arrow schema and one entry per column chunk: about 8 KB for
the token table and 12 KB for the aggregates table of a run evaluating the 22 rules) and, per
column, a page header and a compressed frame. A sampled run (`Keep`) writes a few hundred rows
per table and flush, so a part file every `flush_seconds` costs it about as much again as its
rows, and more on a slower machine (benchmarks/keep_bytes.py). When such a writer closes,
`compact_parts` rewrites each table's consecutive parts of its rank, in groups of at most
`COMPACT_BYTES` on disk, as one part file per group numbered after the last part: the rows of
the group's parts in part order, the parts it replaces listed in its key/value metadata
(`META_REPLACES`, JSON `[[index, rows], ...]`); then it deletes those parts.

Kill safety. The merged part is written atomically (`write_part`) before any part it replaces
is deleted, so a process killed while compacting leaves either the old parts or the merged one,
plus, when killed between the two, some of the parts it replaces: every trustlens reader skips
a part that another part of its table and rank replaces (`replaced_indices`), and the next writer
of the rank deletes it (`remove_replaced`). Rows are never lost or counted twice by trustlens;
another Parquet tool reading the folder in that moment would see the replaced rows twice.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trustlens.run.errors import RunWarning
from trustlens.run.parts import Location, existing_parts, rank_folder, source, write_part
from trustlens.run.schema import META_REPLACES, part_index
from trustlens.run.storage import Remote

# most bytes on disk of the parts merged into one part file (it is read whole into memory)
COMPACT_BYTES = 32 << 20


def replaced_indices(metadata: Mapping[bytes, bytes] | None) -> list[tuple[int, int]]:
    """(part index, rows) of each part that a part file with this key/value `metadata` replaces,
    in part order; [] for a part that replaces none (or whose entry does not parse)."""
    try:
        return [(int(i), int(n)) for i, n in json.loads((metadata or {})[META_REPLACES])]
    except (KeyError, ValueError, TypeError):
        return []


def _size(path: Location) -> int:
    return int(path.fs.size(path.path)) if isinstance(path, Remote) else path.stat().st_size


def _delete(path: Location) -> None:
    if isinstance(path, Remote):
        path.remove_tree()
    else:
        path.unlink(missing_ok=True)


def _groups(files: Sequence[Location]) -> list[list[Location]]:
    """Consecutive runs of `files` holding at most COMPACT_BYTES each, of two parts or more."""
    groups: list[list[Location]] = [[]]
    total = 0
    for f in files:
        size = _size(f)
        if groups[-1] and total + size > COMPACT_BYTES:
            groups.append([])
            total = 0
        groups[-1].append(f)
        total += size
    return [g for g in groups if len(g) > 1]


def _merged(files: Sequence[Location], schema: pa.Schema) -> pa.Table | None:
    """The rows of `files` in part order as one table with `schema`, its metadata listing the
    parts it replaces; None when a part holds other columns (a run resumed from an older
    trustlens) or the rows are not in step order."""
    tables = [pq.read_table(source(f)) for f in files]
    if any(not t.schema.equals(schema) for t in tables):
        return None
    merged = pa.concat_tables(tables)
    steps = merged.column("step").to_numpy()
    if steps.size and np.any(np.diff(steps) < 0):
        return None
    replaces = [[part_index(f.name), t.num_rows] for f, t in zip(files, tables, strict=True)]
    return merged.replace_schema_metadata({**(schema.metadata or {}), META_REPLACES: json.dumps(replaces).encode()})


def compact_table(files: Sequence[Location], schema: pa.Schema, folder: Location, next_index: int) -> int:
    """Merge `files` (one table's parts of one rank, in part order, all with `schema`) group by
    group into part files numbered from `next_index` in `folder`, deleting each group's parts
    once its merged part is written. Returns the number of part files written. A group that cannot
    be merged is left as it is, with a RunWarning when reading or writing it failed."""
    written = 0
    for group in _groups(files):
        try:
            merged = _merged(group, schema)
            if merged is None:
                continue
            write_part(merged, folder, next_index + written)
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            what = f"could not compact the part files of {folder}: {err}; they are kept as written"
            warnings.warn(what, RunWarning, stacklevel=2)
            continue
        written += 1
        for f in group:
            _delete(f)
    return written


def remove_replaced(run_dir: Location, rank: int) -> None:
    """Delete this rank's part files that another part of their table replaces (left by a writer
    killed while compacting)."""
    for files in existing_parts(run_dir, rank).values():
        gone: set[int] = set()
        for f in files:
            with contextlib.suppress(OSError, ValueError):  # an unreadable part replaces none
                gone.update(i for i, _ in replaced_indices(pq.read_metadata(source(f)).metadata))
        for f in files:
            if part_index(f.name) in gone:
                _delete(f)


def compact_parts(run_dir: Location, rank: int, schemas: Mapping[str, pa.Schema], next_index: dict[str, int]) -> int:
    """Compact every table of `rank` in `run_dir` (`compact_table`); `next_index` (table -> the
    number of its next part) is advanced past the parts written. Returns the part files written."""
    written = 0
    for table, files in existing_parts(run_dir, rank).items():
        if len(files) > 1:
            n = compact_table(files, schemas[table], rank_folder(run_dir, table, rank), next_index[table])
            next_index[table] += n
            written += n
    return written


__all__ = ["COMPACT_BYTES", "compact_parts", "compact_table", "remove_replaced", "replaced_indices"]
