"""The Parquet schema of a recorded run (docs/run-format.md): columns, types, meanings, version.

One table per kind of row, each written as part files per rank:
    tokens   one row per (step, update, sample, position)
    samples  one row per (step, sample)
    metrics  long format: one row per (step, name)
    alerts   one row per alert raised live, or changed, while the run was written (trustlens.live)
    routing  one row per (step, update, MoE layer) of a mixture-of-experts run (trustlens.run.routes)
The column docs are used for validation, for the docs and for the dashboard's tooltips.

Schema 2 stores the rank only in the folder name (`<table>/rank=R/`, Hive partitioning), so that
every Parquet reader (pandas, pyarrow.dataset, DuckDB, polars) gets one `rank` column from the
path; `load_run` adds it the same way. Schema 1 files also held `rank` as a column: they are
still read (the column in the file wins).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from trustlens.core.version import __version__

SCHEMA_VERSION = 2
# oldest schema version this trustlens still reads
OLDEST_SCHEMA_VERSION = 1
# keys of the Parquet file metadata that every part file carries
META_SCHEMA_VERSION = b"trustlens.schema_version"
META_TRUSTLENS_VERSION = b"trustlens.version"
# the world size of the writer of a part file (the reader refuses a run whose parts disagree)
META_WORLD_SIZE = b"trustlens.world_size"
# the parts a compacted part file replaces: JSON [[part index, rows], ...] (trustlens.run.compact)
META_REPLACES = b"trustlens.replaces"
BLOCKED_PREFIX = "blocked_"
# the column every table gets from its rank=R folder (a file column in schema 1)
RANK = "rank"
RANK_TYPE = pa.int16()
RANK_DOC = "data-parallel rank that recorded the row (from the rank=R folder)"


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
    Column(
        "pi_logp_raw",
        _F,
        True,
        "log π(a_t) from the logits before the sampling temperature, nats; null when no logits or τ = 1",
    ),
    Column("mu_topk_mass", _F, True, "Σ μ over μ's top-K ids (a_t included), probability mass; null without top-K"),
    Column("pi_topk_mass", _F, True, "Σ π over μ's top-K ids (a_t included), probability mass; null without top-K"),
    Column(
        "support_size", _F, True, "ids in the engine's sampling support at the position, a count; null without its mask"
    ),
    Column(
        "pi_support_mass", _F, True, "Σ π over the engine's sampling support, probability mass; null without its mask"
    ),
    Column(
        "staleness",
        _F,
        True,
        "weight updates between the weights that sampled a_t (engine weight version) and π's; null when not given",
    ),
    Column("advantage", _F, True, "advantage of the token (sequence advantages broadcast)"),
    Column("weight", _F, True, "sampling weight of a run recorded with Keep: 1/rate for the random share, else 1"),
    Column("seq_logratio_mu", pa.float64(), True, "Σ log(π/μ) over the token's response, nats (π/π_old without μ)"),
    Column("seq_logratio_old", pa.float64(), True, "Σ log(π/π_old) over the token's response, nats"),
    Column("seq_tokens", pa.int32(), True, "token count of the token's response (in its record call)"),
    Column("route_flips", pa.int16(), True, "MoE layers whose expert sets differ between μ and π; null: no routing"),
    Column("route_first_flip", pa.int16(), True, "the first MoE layer whose expert sets differ; null: none"),
    Column("route_overlap", _F, True, "mean over MoE layers of |S_μ ∩ S_π| / k; null: no routing"),
    Column("route_layers", pa.list_(pa.int16()), True, "the MoE layers whose expert sets differ, in order"),
    Column("route_mu_experts", pa.list_(pa.int16()), True, "μ's k experts (sorted) at each of route_layers"),
    Column("route_pi_experts", pa.list_(pa.int16()), True, "π's k experts (sorted) at each of route_layers"),
    Column(
        "seq_weight",
        _F,
        True,
        "the sequence-level importance weight the trainer applied to the token's response, as it computed it; "
        "null when not given",
    ),
)

SAMPLE_COLUMNS: tuple[Column, ...] = (
    Column("step", pa.int32(), False, "training step"),
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
    Column("name", pa.string(), False, "metric name, e.g. reward/mean or blocked/ppo"),
    Column("value", pa.float64(), True, "metric value"),
)

ALERT_COLUMNS: tuple[Column, ...] = (
    Column("step", pa.int32(), False, "first step of the alert (a doctor finding: the step it was first seen at)"),
    Column("end_step", pa.int32(), False, "last flagged step of the alert so far"),
    Column("critical_step", pa.int32(), True, "first critical step of a collapse alert (null: none yet)"),
    Column(
        "evidence_start_step",
        pa.int32(),
        True,
        "where a collapse alert's evidence began: its first flagged step or that of the warnings before it",
    ),
    Column("evidence", pa.list_(pa.string()), True, "the kinds of the warnings a collapse alert follows"),
    Column("drivers_step", pa.int32(), True, "the step `samples` and `tokens` are read at (collapse)"),
    Column("source", pa.string(), False, "collapse (trustlens.analysis.collapse) or doctor (its findings)"),
    Column("kind", pa.string(), False, "the collapse detector (ALERT_KINDS) or the doctor's check"),
    Column("signal", pa.string(), True, "the step signal a collapse alert watched (e.g. blocked_ppo)"),
    Column("severity", pa.string(), False, "info, warning or critical (collapse); warning or problem (doctor)"),
    Column("provisional", pa.bool_(), False, "True while later steps may still change the alert"),
    Column("raised_at_step", pa.int32(), False, "the completed step whose rows raised or changed it"),
    Column("raised_wall_time", pa.timestamp("ms", tz="UTC"), False, "UTC time it was raised or changed"),
    Column("value", pa.float64(), True, "the most extreme value of the watched signal (collapse)"),
    Column("baseline", pa.float64(), True, "the baseline median of the watched signal (collapse)"),
    Column("z", pa.float64(), True, "robust z-score at the most extreme step (collapse; null without a scale)"),
    Column("message", pa.string(), False, "one line for people"),
    Column("samples", pa.list_(pa.int64()), True, "ids of the samples that drove it, at `step`"),
    Column(
        "tokens",
        pa.list_(pa.struct([("sample", pa.int64()), ("update", pa.int16()), ("pos", pa.int32())])),
        True,
        "(sample, update, pos) of the tokens that drove it, at `step`",
    ),
)

ROUTING_COLUMNS: tuple[Column, ...] = (
    Column("step", pa.int32(), False, "training step"),
    Column("update", pa.int16(), False, "minibatch update within the step"),
    Column("layer", pa.int16(), False, "MoE layer, 0-based (dense layers have no row)"),
    Column("tokens", pa.int64(), False, "tokens of the record call routed at this layer (all of them, kept or not)"),
    Column("flips", pa.int64(), False, "of them, those whose expert sets differ between μ and π"),
    Column("overlap", pa.float64(), False, "Σ over them of |S_μ ∩ S_π| / k (mean: overlap / tokens)"),
)

AGGREGATE_KEYS: tuple[Column, ...] = (
    Column("step", pa.int32(), False, "training step"),
    Column("update", pa.int16(), False, "minibatch update within the step"),
)

TABLES: dict[str, tuple[Column, ...]] = {
    "tokens": TOKEN_COLUMNS,
    "samples": SAMPLE_COLUMNS,
    "metrics": METRIC_COLUMNS,
    "aggregates": AGGREGATE_KEYS,  # plus aggregate_columns(rules): trustlens.run.aggregates
    "alerts": ALERT_COLUMNS,
    "routing": ROUTING_COLUMNS,
}
# the tables whose rank column goes after `update` (the others: after `step`)
UPDATE_TABLES = ("tokens", "aggregates", "routing")


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
    if name == RANK:
        return RANK_DOC
    for columns in TABLES.values():
        for c in columns:
            if c.name == name:
                return c.doc
    rule = rule_of_column(name)
    if rule is not None:
        return f"True where rule {rule!r} blocks the update"
    from trustlens.run.aggregates import aggregate_doc

    doc = aggregate_doc(name)
    if doc is None:
        raise KeyError(f"unknown column {name!r}")
    return doc


def aggregate_columns(rules: list[str] | tuple[str, ...]) -> tuple[Column, ...]:
    """All columns of the aggregates table of a run that evaluates `rules` (a sampled run)."""
    from trustlens.run.aggregates import aggregate_doc, aggregate_names

    return AGGREGATE_KEYS + tuple(
        Column(name, kind, True, aggregate_doc(name) or "") for name, kind in aggregate_names(rules)
    )


def _columns(table: str, rules: list[str] | tuple[str, ...]) -> tuple[Column, ...]:
    if table not in TABLES:
        raise KeyError(f"unknown table {table!r}; known: {', '.join(TABLES)}")
    if table == "tokens":
        return token_columns(rules)
    return aggregate_columns(rules) if table == "aggregates" else TABLES[table]


def table_schema(table: str, rules: list[str] | tuple[str, ...] = ()) -> pa.Schema:
    """The Arrow schema of the part files of `table` ("tokens", "samples" or "metrics"), with
    the Parquet metadata every part file carries (schema version, trustlens version); `rules`
    adds the `blocked_<rule>` token columns. `rank` is not among them: it is the folder's."""
    return arrow_schema(_columns(table, rules), file_metadata())


def frame_schema(table: str, rules: list[str] | tuple[str, ...] = ()) -> pa.Schema:
    """The Arrow schema of `table` as `load_run` returns it: the file columns plus `rank`,
    placed after `update` (tokens, aggregates) or `step` (samples, metrics, alerts)."""
    columns = list(_columns(table, rules))
    at = [c.name for c in columns].index("update" if table in UPDATE_TABLES else "step") + 1
    columns.insert(at, Column(RANK, RANK_TYPE, False, RANK_DOC))
    return arrow_schema(tuple(columns))


def file_metadata() -> dict[bytes, bytes]:
    """The key/value metadata of every part file: schema version and trustlens version."""
    return {META_SCHEMA_VERSION: str(SCHEMA_VERSION).encode(), META_TRUSTLENS_VERSION: __version__.encode()}


# ---- the layout of a run directory (docs/run-format.md) ----

# part files of one table and rank: RUN_DIR/<table>/rank=<R>/part-<NNNNNN>.parquet
RANK_DIR_PREFIX = "rank="
PART_GLOB = "rank=*/part-*.parquet"


def rank_dir(run_dir: str | Path, table: str, rank: int) -> Path:
    """The folder of `table`'s part files written by `rank`."""
    return Path(run_dir) / table / f"{RANK_DIR_PREFIX}{rank}"


def part_path(run_dir: str | Path, table: str, rank: int, index: int) -> Path:
    """The path of part file number `index` of `table` written by `rank`."""
    return rank_dir(run_dir, table, rank) / part_name(index)


def part_name(index: int) -> str:
    """The file name of part number `index`."""
    return f"part-{index:06d}.parquet"


def part_index(name: str) -> int | None:
    """The number of part file `name`, or None when `name` is not a part file's name."""
    stem = name.removeprefix("part-").removesuffix(".parquet")
    if len(name) != len(stem) + len("part-.parquet") or not stem.isdigit():
        return None
    return int(stem)


def rank_of_dir(name: str) -> int | None:
    """The rank R of a folder named `rank=R`, or None for any other name."""
    value = name.removeprefix(RANK_DIR_PREFIX)
    if value == name or not value.isdigit() or str(int(value)) != value:
        return None
    return int(value)
