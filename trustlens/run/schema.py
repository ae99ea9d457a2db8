"""The Parquet schema of a recorded run (DESIGN §4): columns, types, one-line meanings, version.

One table per kind of row, each written as part files per rank:
    tokens   one row per (step, update, sample, position)
    samples  one row per (step, sample)
    metrics  long format: one row per (step, name)
The column docs are used for validation, for the docs and for the dashboard's tooltips.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from trustlens import __version__

SCHEMA_VERSION = 1
# keys of the Parquet file metadata that every part file carries
META_SCHEMA_VERSION = b"trustlens.schema_version"
META_TRUSTLENS_VERSION = b"trustlens.version"
BLOCKED_PREFIX = "blocked_"


@dataclass(frozen=True)
class Column:
    name: str  # column name in the Parquet file
    type: pa.DataType  # its Arrow type
    nullable: bool  # whether a writer may leave it null (e.g. μ absent in an external run)
    doc: str  # one-line meaning, with units


_F = pa.float32()

TOKEN_COLUMNS: tuple[Column, ...] = (
    Column("step", pa.int32(), False, "training step (one rollout batch)"),
    Column("update", pa.int16(), False, "minibatch update within the step, 0-based"),
    Column("rank", pa.int16(), False, "data-parallel rank that recorded the row"),
    Column("sample", pa.int64(), False, "sample (response) id, unique within the run"),
    Column("group", pa.int64(), False, "group id: samples of one prompt share it (GRPO)"),
    Column("pos", pa.int32(), False, "position of the token in the response, 0-based"),
    Column("token_id", pa.int32(), False, "vocabulary id of the sampled token a_t"),
    Column("token", pa.string(), True, "decoded text of the token (untrusted: render as text)"),
    Column("mu_logp", _F, True, "log μ(a_t): rollout-engine log-probability, nats"),
    Column("old_logp", _F, True, "log π_old(a_t): trainer recomputation before the update, nats"),
    Column("pi_logp", _F, False, "log π(a_t): policy being updated, nats"),
    Column("ratio", _F, True, "π(a_t)/μ(a_t) (π/π_old when μ is absent)"),
    Column("binary_tv", _F, True, "|π(a_t) − μ(a_t)|, probability mass"),
    Column("binary_kl", _F, True, "KL(μ‖π) over buckets {a_t, rest}, nats"),
    Column("topk_tv", _F, True, "TV over μ's top-K ids plus the rest bucket, probability mass"),
    Column("topk_kl", _F, True, "KL(μ‖π) over μ's top-K ids plus the rest bucket, nats"),
    Column("entropy", _F, True, "entropy of π at this position, nats"),
    Column("advantage", _F, True, "advantage of the token (sequence advantages broadcast)"),
)

SAMPLE_COLUMNS: tuple[Column, ...] = (
    Column("step", pa.int32(), False, "training step"),
    Column("rank", pa.int16(), False, "data-parallel rank that recorded the row"),
    Column("sample", pa.int64(), False, "sample id, joins tokens.sample"),
    Column("group", pa.int64(), True, "group id: samples of one prompt share it"),
    Column("prompt", pa.string(), True, "prompt text (untrusted: render as text)"),
    Column("response", pa.string(), True, "response text (untrusted: render as text)"),
    Column("reward", _F, True, "scalar reward of the response"),
    Column("advantage", _F, True, "sequence advantage"),
    Column("length", pa.int32(), True, "response length in tokens"),
)

METRIC_COLUMNS: tuple[Column, ...] = (
    Column("step", pa.int32(), False, "training step"),
    Column("rank", pa.int16(), False, "data-parallel rank that logged it"),
    Column("name", pa.string(), False, "metric name, e.g. reward/mean or blocked/ppo"),
    Column("value", pa.float64(), True, "metric value"),
)

TABLES: dict[str, tuple[Column, ...]] = {
    "tokens": TOKEN_COLUMNS,
    "samples": SAMPLE_COLUMNS,
    "metrics": METRIC_COLUMNS,
}


def blocked_column(rule: str) -> str:
    """The token column that holds `rule`'s decision: True = the update is blocked."""
    return BLOCKED_PREFIX + rule


def rule_of_column(name: str) -> str | None:
    """The rule name of a `blocked_<rule>` column, or None for any other column."""
    return name[len(BLOCKED_PREFIX) :] if name.startswith(BLOCKED_PREFIX) else None


def token_columns(rules: list[str] | tuple[str, ...]) -> tuple[Column, ...]:
    """All token columns for a run that evaluates `rules`, in file order."""
    extra = tuple(
        Column(blocked_column(r), pa.bool_(), True, f"True where rule {r!r} blocks the update") for r in rules
    )
    return TOKEN_COLUMNS + extra


def arrow_schema(columns: tuple[Column, ...], metadata: dict[bytes, bytes] | None = None) -> pa.Schema:
    """The Arrow schema of `columns`; `token` is dictionary-encoded."""
    fields = [
        pa.field(c.name, pa.dictionary(pa.int32(), pa.string()) if c.name == "token" else c.type, c.nullable)
        for c in columns
    ]
    return pa.schema(fields, metadata=metadata)


def column_doc(name: str) -> str:
    """The one-line meaning of any column of any table (tooltips, docs)."""
    for columns in TABLES.values():
        for c in columns:
            if c.name == name:
                return c.doc
    rule = rule_of_column(name)
    if rule is not None:
        return f"True where rule {rule!r} blocks the update"
    raise KeyError(f"unknown column {name!r}")


def table_schema(table: str, rules: list[str] | tuple[str, ...] = ()) -> pa.Schema:
    """The Arrow schema of `table` ("tokens", "samples" or "metrics"), with the Parquet metadata
    every part file carries (schema version, trustlens version); `rules` adds the
    `blocked_<rule>` token columns."""
    if table not in TABLES:
        raise KeyError(f"unknown table {table!r}; known: {', '.join(TABLES)}")
    columns = token_columns(rules) if table == "tokens" else TABLES[table]
    return arrow_schema(columns, file_metadata())


def file_metadata() -> dict[bytes, bytes]:
    """The key/value metadata of every part file: schema version and trustlens version."""
    return {META_SCHEMA_VERSION: str(SCHEMA_VERSION).encode(), META_TRUSTLENS_VERSION: __version__.encode()}


# ---- the layout of a run directory (DESIGN §4) ----

MANIFEST = "run.json"
# part files of one table and rank: RUN_DIR/<table>/rank=<R>/part-<NNNNNN>.parquet
PART_GLOB = "rank=*/part-*.parquet"

# the keys of run.json and their meaning
MANIFEST_FIELDS: dict[str, str] = {
    "schema_version": "version of this data contract (SCHEMA_VERSION) the run was written with",
    "trustlens_version": "trustlens version that wrote the run",
    "status": "running | finished | failed",
    "error": "the error that ended a failed run (type: message), else null",
    "created": "UTC time the recorder opened the run, ISO 8601",
    "updated": "UTC time of the last part file or status change, ISO 8601",
    "config": "the training configuration passed to the recorder (free-form JSON)",
    "rules": "every evaluated rule: {name: {low, high, anchor, description}}",
    "active_rule": "the rule the run trains with (null when unknown)",
    "world_size": "number of ranks recording shards",
    "anchor": "what ratio and divergences compare π with: mu (the rollout policy), old (π_old, "
    "when μ was not recorded) or mixed; null before the first record",
    "missing": "token quantities never recorded so far (their columns are null)",
    "flush": "writer settings: rows_per_file and flush_seconds (the most a killed run loses)",
}


def part_path(run_dir: str | Path, table: str, rank: int, index: int) -> Path:
    """The path of part file number `index` of `table` written by `rank`."""
    return Path(run_dir) / table / f"rank={rank}" / f"part-{index:06d}.parquet"
