"""Part files of the run format: what goes in one (Arrow rows, the `token` dictionary, the
Parquet options) and how one is written, listed and inspected.

`write_part` writes a table as one numbered part file atomically: locally under a hidden
temporary name, fsynced, then renamed (so a killed process leaves only complete files and a
failed write no temporary file); on an object store as one upload of the complete object.
`PartFiles` buffers one table's rows of one rank and writes them as the next part file, sorted
by step. Only `trustlens.run.writer` writes through here.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trustlens.run.routes import ROUTE_SCALARS, RouteLists, route_scalar_array
from trustlens.run.schema import META_WORLD_SIZE, RANK_DIR_PREFIX, TABLES, blocked_column, part_index, part_name
from trustlens.run.storage import Remote, write_local_atomic

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
    write_local_atomic(final, lambda f: pq.write_table(table, f, **write_options(table.schema)))
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
    routes: RouteLists | None = None  # a call with routed experts: the expert sets at each row's flipped layers
    routing: np.ndarray | None = None  # (3, L) int64 per layer: MoE tokens, flipped, shared experts (all rows)

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
        **{blocked_column(rule): v for rule, v in batch.blocked.items()},
    }
    lists = batch.routes.arrays() if batch.routes is not None else {}
    arrays, fields = [], []
    for field in schema:
        if field.name == "token":
            continue
        value = given.get(field.name)
        if field.name in lists:
            arrays.append(lists[field.name])
        elif value is None:
            arrays.append(pa.nulls(n, field.type))
        elif field.name in ROUTE_SCALARS:
            arrays.append(route_scalar_array(value, field.type))
        else:
            arrays.append(pa.array(value, field.type))
        fields.append(field)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


# a UTF-16 surrogate code point: only ever half of a pair, which UTF-8 (Parquet's text) cannot hold alone
_SURROGATE = re.compile("[\ud800-\udfff]")


def storable_text(text: str) -> str:
    """`text` as a part file can hold it: each lone surrogate (e.g. from a tokenizer that splits
    an emoji, or text decoded with errors="surrogateescape") replaced by U+FFFD, the rest kept."""
    return _SURROGATE.sub("\ufffd", text)


class TokenDecoder:
    """Token id -> text, decoding each id once (a cache) with `tokenizer.batch_decode` (else
    `tokenizer.decode`); None without a tokenizer. The text is untrusted model output: stored as
    is (lone surrogates replaced, `storable_text`), to be rendered as text."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def decode(self, ids: list[int]) -> list[str]:
        """The texts of `ids` (cached), one str per id; TypeError naming `tokenizer` when it
        returns anything else."""
        missing = [i for i in ids if i not in self.cache]
        if missing:
            tokenizer: Any = self.tokenizer
            if hasattr(tokenizer, "batch_decode"):
                how, texts = "batch_decode", tokenizer.batch_decode([[i] for i in missing])
            else:
                how, texts = "decode", [tokenizer.decode([i]) for i in missing]
            if not isinstance(texts, (list, tuple)) or len(texts) != len(missing):
                raise TypeError(
                    f"tokenizer.batch_decode must return a list of one str per id, got {type(texts).__name__} "
                    f"{texts!r:.80} for {len(missing)} ids"
                )
            wrong = next(((i, t) for i, t in zip(missing, texts, strict=True) if not isinstance(t, str)), None)
            if wrong is not None:
                call = f"batch_decode([[{wrong[0]}]])" if how == "batch_decode" else f"decode([{wrong[0]}])"
                raise TypeError(
                    f"tokenizer.{how} must give one str per id; tokenizer.{call} gave "
                    f"{type(wrong[1]).__name__} {wrong[1]!r:.80}"
                )
            self.cache.update(zip(missing, map(storable_text, texts), strict=True))
        return [self.cache[i] for i in ids]

    def dictionary_column(self, token_ids: pa.ChunkedArray) -> pa.ChunkedArray:
        """The `token` column for `token_ids`: dictionary-encoded, one entry per distinct id,
        one dictionary shared by all chunks."""
        if self.tokenizer is None:
            return pa.chunked_array([pa.nulls(len(token_ids), pa.dictionary(pa.int32(), pa.string()))])
        encoded = pc.dictionary_encode(token_ids)  # hash-based; its chunks share one dictionary
        ids = encoded.chunk(0).dictionary.to_pylist() if encoded.num_chunks else []
        dictionary = pa.array(self.decode(ids), pa.string())
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


def existing_parts(run_dir: Location, rank: int) -> dict[str, list[Location]]:
    """This rank's part files per table, in part order."""
    out = {}
    for table in TABLES:
        folder = rank_folder(run_dir, table, rank)
        out[table] = [folder / n for n, is_dir in list_folder(folder) if not is_dir and part_index(n) is not None]
    return out


def written_world_size(path: Location) -> int | None:
    """The world size stamped in part file `path`'s metadata (None: written before it was)."""
    value = (pq.read_schema(source(path)).metadata or {}).get(META_WORLD_SIZE)
    return int(value) if value is not None and value.isdigit() else None


def last_step(files: list[Location]) -> int | None:
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


def check_resumed_rules(run_dir: str | os.PathLike, rank: int, rules: list[str]) -> None:
    """Refuse to resume the run in `run_dir` with another rule set than it was recorded with
    (run.json's rules, and the `blocked_<rule>` columns of this rank's last token part): its
    parts would no longer share one schema. Nothing to compare (a new run) passes."""
    from trustlens.run.manifest import read_manifest
    from trustlens.run.schema import rule_of_column
    from trustlens.run.storage import is_url, local_path

    location: Location = Remote.of(os.fspath(run_dir)) if is_url(run_dir) else local_path(run_dir)
    recorded: dict[str, list[str]] = {}
    with contextlib.suppress(ValueError, OSError):  # no run yet, or an unreadable run.json: the parts still say
        recorded["run.json"] = list(read_manifest(location).get("rules") or {})
    tokens = existing_parts(location, rank)["tokens"]
    if tokens:
        names = pq.read_schema(source(tokens[-1])).names
        recorded[str(tokens[-1])] = [r for r in map(rule_of_column, names) if r is not None]
    for where, had in recorded.items():
        if set(had) != set(rules):
            added, dropped = sorted(set(rules) - set(had)), sorted(set(had) - set(rules))
            raise ValueError(
                f"rules differ from those the run in {str(location)!r} was recorded with ({where}): "
                f"added {added or 'none'}, dropped {dropped or 'none'}; resume with rules={had!r} "
                "or record a new run"
            )


# part files whose pages passed the checksum check in this process: (path, size, mtime_ns)
_verified: set[tuple[str, int, int]] = set()


def verify_pages(path: Location) -> None:
    """Read every page of `path` with its CRC checked, once per process and file version."""
    if isinstance(path, Remote):
        info = path.fs.info(path.path)
        key = (path.url, int(info.get("size") or 0), hash(str(info.get("ETag") or info.get("mtime"))))
    else:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
    if key in _verified:
        return
    pq.ParquetFile(source(path), page_checksum_verification=True).read()
    _verified.add(key)
