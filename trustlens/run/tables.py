"""Whole tables written as a run through the one writer (`trustlens.run.writer.RankWriter`).

`write_ranks` splits tables with a `rank` column (or token batches per rank) over one
`RankWriter` per rank, rank 0 holding run.json; the synthetic generator writes through it.
`write_run` writes a small hand-built run from column lists, for tests with known answers and
odd inputs (e.g. hostile token text).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trustlens.run.aggregates import Keep, check_kept_rules, keep_rows
from trustlens.run.manifest import STATUSES, new_manifest
from trustlens.run.parts import Location
from trustlens.run.schema import RANK, rule_of_column, table_schema, token_columns
from trustlens.run.writer import RankWriter

if TYPE_CHECKING:
    from trustlens.rules import Rule


def rule_entries(rules: Sequence[str | Rule]) -> dict[str, dict]:
    """The manifest's `rules` entry: {name: `Rule.manifest_entry()`}, every field a rule needs to be
    evaluated again without its code."""
    from trustlens.rules import get_rule

    out: dict[str, dict] = {}
    for name in rules:
        try:
            rule = get_rule(name)
        except KeyError as err:
            raise ValueError(f"rules: {err.args[0]}") from None
        out[rule.name] = rule.manifest_entry()
    return out


def check_status(status: str) -> None:
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")


def write_ranks(
    path: str | os.PathLike,
    tables: Iterable[dict[str, pa.Table]],
    *,
    world_size: int,
    rules: list[str],
    manifest: dict,
    rows_per_part: int,
    status: str,
    keep: Keep | None = None,
    tokenizer: Any | None = None,
) -> Location:
    """Write `tables` (an iterable of {table: rows with a `rank` column}, or "batches": a list of
    (rank, TokenBatch) for the token rows, kept under `keep` and decoded with `tokenizer` as the
    recorder does) through one `RankWriter` per rank; rank 0 holds `manifest`. Ends the run with
    `status`."""
    check_kept_rules(keep, rules)
    active = manifest.get("active_rule")  # its blocked tokens are kept at weight 1, as by the recorder
    writers = [
        RankWriter(
            path,
            rank=rank,
            world_size=world_size,
            rules=rules,
            manifest=manifest if rank == 0 else None,
            rows_per_file=rows_per_part,
            tokenizer=tokenizer,
            compact=False,  # the parts rows_per_part asks for, also in a sampled run
        )
        for rank in range(world_size)
    ]
    try:
        for step_tables in tables:
            for kind, table in step_tables.items():
                if kind == "batches":  # [(rank, TokenBatch)]: written as the recorder writes them
                    for rank, batch in table:
                        rows = batch if keep is None else keep_rows(batch, keep, rules, rank, active)
                        for name, part in writers[rank].token_batches(rows):
                            writers[rank].append(name, part)
                    continue
                ranks = table[RANK].to_numpy()
                if np.any(ranks[1:] < ranks[:-1]):  # generated tables are rank-major already
                    table = table.take(pc.sort_indices(table, [(RANK, "ascending")]))
                    ranks = table[RANK].to_numpy()
                bounds = np.searchsorted(ranks, np.arange(world_size + 1))
                rows = table.drop_columns([RANK])
                for rank, writer in enumerate(writers):
                    writer.append(kind, rows.slice(bounds[rank], bounds[rank + 1] - bounds[rank]))
        for writer in reversed(writers):  # rank 0 last: its status is the run's
            writer.close(status)
    except BaseException as err:
        for writer in writers:
            writer.end("failed", f"{type(err).__name__}: {err}")
        raise
    return writers[0].path


# Defaults for token columns a hand-built run may leave out (see `write_run`).
TOKEN_DEFAULTS = {"update": 0, "rank": 0, "token_id": 0}


def write_run(
    path: str | os.PathLike,
    *,
    tokens: Mapping[str, Sequence] | pa.Table,
    samples: Mapping[str, Sequence] | pa.Table | None = None,
    metrics: Mapping[str, Sequence] | pa.Table | None = None,
    rules: Sequence[str] | None = None,
    status: str = "finished",
    config: dict | None = None,
) -> Location:
    """Write a small hand-built run (one part file per table and rank) through the run writer.

    `tokens` needs step, sample, pos and pi_logp; update, rank and token_id default to 0, group to
    the sample id, every other column to null. `rules` defaults to the rules whose
    `blocked_<rule>` columns are given (rules not given a column get a null one). samples and
    metrics are optional; their missing nullable columns are null and rank defaults to 0. The
    run has as many ranks as the largest rank given + 1. run.json's config gets `steps`, the
    number of distinct steps written (the run's planned steps, as a trainer's config says them),
    unless `config` gives it.
    Used by tests with known answers (and for odd inputs such as hostile token text).
    """
    check_status(status)
    token_data = dict(tokens.to_pydict() if isinstance(tokens, pa.Table) else tokens)
    given_rules = [r for r in map(rule_of_column, token_data) if r is not None]
    rules = list(given_rules if rules is None else rules)
    rule_entries(rules)  # unknown rules fail before anything is written
    n = len(token_data.get("step", ()))
    token_data.setdefault("group", token_data.get("sample"))
    for name, value in TOKEN_DEFAULTS.items():
        token_data.setdefault(name, [value] * n)
    tables = {"tokens": _table(token_data, table_schema("tokens", rules), n, "tokens")}
    for kind, data in (("samples", samples), ("metrics", metrics)):
        if data is None:
            continue
        data = dict(data.to_pydict() if isinstance(data, pa.Table) else data)
        rows = len(data.get("step", ()))
        data.setdefault(RANK, [0] * rows)
        tables[kind] = _table(data, table_schema(kind), rows, kind)
    mu = token_data.get("mu_logp")
    has_mu = mu is not None and any(v is not None for v in mu)
    manifest = new_manifest(
        rules=rule_entries(rules),
        active_rule=rules[0] if rules else None,
        config={
            "source": "hand-built",
            "steps": len(set(pc.unique(pa.chunked_array([t["step"] for t in tables.values()])).to_pylist())),
            **(config or {}),
        },
        world_size=max(int(pc.max(t[RANK]).as_py() or 0) for t in tables.values()) + 1,
        anchor="mu" if has_mu else "old",
        missing=[c.name for c in token_columns(rules) if c.nullable and c.name not in token_data],
    )
    return write_ranks(
        path,
        [tables],
        world_size=manifest["world_size"],
        rules=rules,
        manifest=manifest,
        rows_per_part=max(t.num_rows for t in tables.values()) + 1,
        status=status,
    )


def _table(data: dict[str, Sequence], schema: pa.Schema, n: int, kind: str) -> pa.Table:
    """`data` as a table of `schema` plus `rank`: missing nullable columns null, rows sorted by
    step."""
    schema = schema.append(pa.field(RANK, pa.int16(), False))
    unknown = sorted(set(data) - set(schema.names))
    if unknown:
        raise ValueError(f"{kind}: unknown columns {unknown}; columns are {schema.names}")
    arrays = []
    for field in schema:
        if field.name in data:
            values = data[field.name]
            if len(values) != n:
                raise ValueError(f"{kind}[{field.name!r}] has {len(values)} rows, step has {n}")
            arrays.append(pa.array(values).cast(field.type) if field.name == "token" else pa.array(values, field.type))
        elif field.nullable:
            arrays.append(pa.nulls(n, field.type))
        else:
            raise ValueError(f"{kind}: column {field.name!r} is required")
    table = pa.Table.from_arrays(arrays, schema=schema)
    return table.take(pc.array_sort_indices(table["step"]))
