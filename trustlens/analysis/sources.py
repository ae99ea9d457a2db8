"""What the analyses accept: a `Run` (as `load_run` returns it) or its token rows (`run.tokens`, a
polars LazyFrame), and nothing else.

Given a `Run`, an analysis reads its token rows and, for a sampled run (recorded with `Keep`), its
exact per-step aggregates of all tokens wherever they give the value (the `aggregates` argument of
`step_summary`, `blocked_per_step`, `mismatch_per_step` and `rule_confusion`): the obvious call
`step_summary(run)` gives the exact number, as the dashboard shows it. Given a LazyFrame, a sampled
run's rows count with their sampling weights (estimates) unless `aggregates=` is passed.

Anything else is a TypeError naming the function, the argument and what it was given.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import fields
from typing import TypeAlias

import polars as pl

from trustlens.core.argument_checks import check_keys, check_str
from trustlens.rules import Rule, rule_from_manifest
from trustlens.run.reader import RecordedRules, Run

RunOrTokens: TypeAlias = Run | pl.LazyFrame


def _given(value: object) -> str:
    if isinstance(value, pl.DataFrame):
        return "a polars DataFrame (pass df.lazy(), or the Run itself)"
    if isinstance(value, (str, bytes)) or hasattr(value, "__fspath__"):
        return f"the path {value!r} (load it first: trustlens.load_run(path))"
    return f"{type(value).__name__} {value!r:.80}"


# columns that make a LazyFrame the aggregates table (trustlens.run.aggregates): a token table has none of the last two
AGGREGATE_KEYS = ("step", "update", "tokens", "pairs")


def _what_rows(names: list[str]) -> str:
    """What a LazyFrame with columns `names` most likely holds, for an error."""
    for table, marker in (("token rows", "pos"), ("samples", "sample"), ("metrics", "value")):
        if marker in names:
            return f"its columns {', '.join(names[:4])}, … look like the run's {table}"
    return f"columns {', '.join(names[:6])}"


def token_rows(
    function: str, source: object, aggregates: pl.LazyFrame | None = None
) -> tuple[pl.LazyFrame, pl.LazyFrame | None]:
    """(token rows, exact aggregates or None) of `source`, a Run or its token rows.

    A Run of a sampled run brings its aggregates, unless `aggregates` is given (it wins); a
    LazyFrame brings only the `aggregates` given. TypeError for anything else."""
    if aggregates is not None:
        names = aggregates.collect_schema().names() if isinstance(aggregates, pl.LazyFrame) else None
        if names is None or not set(AGGREGATE_KEYS) <= set(names):
            got = _given(aggregates) if names is None else f"a LazyFrame of other rows ({_what_rows(names)})"
            raise TypeError(
                f"{function}: aggregates must be the run's exact aggregates (Run.aggregates, a polars LazyFrame "
                f"with columns {', '.join(AGGREGATE_KEYS)}), got {got}"
            )
    rows = lazy_rows(function, source)
    if aggregates is None and isinstance(source, Run) and source.sampled:
        aggregates = source.aggregates
    return rows, aggregates


def lazy_rows(function: str, source: object, name: str = "tokens") -> pl.LazyFrame:
    """The rows of `source` (a Run: its token rows; a LazyFrame as it is), for analyses that
    have no exact form; TypeError for anything else."""
    if isinstance(source, Run):
        return source.tokens
    if isinstance(source, pl.LazyFrame):
        names = source.collect_schema().names()
        if set(AGGREGATE_KEYS) <= set(names) and "pos" not in names:
            raise TypeError(
                f"{function}: {name} must be a Run (trustlens.load_run) or a polars LazyFrame of its token rows, "
                "got the run's aggregates (pass those as aggregates=)"
            )
        return source
    raise TypeError(
        f"{function}: {name} must be a Run (trustlens.load_run) or a polars LazyFrame of its rows, got {_given(source)}"
    )


def require_run(function: str, source: object, name: str = "run") -> Run:
    """`source` when it is a Run; TypeError otherwise (an analysis that needs the run's metrics and
    manifest, not only its token rows)."""
    if isinstance(source, Run):
        return source
    if isinstance(source, pl.LazyFrame):
        raise TypeError(
            f"{function}: {name} must be the Run (trustlens.load_run), not its token rows: it reads the run's "
            "metrics and run.json too"
        )
    raise TypeError(f"{function}: {name} must be a Run (trustlens.load_run), got {_given(source)}")


# The fields of a rule's manifest entry (`Rule.manifest_entry`): every field of a Rule but its name.
RULE_FIELDS = tuple(f.name for f in fields(Rule) if f.name != "name")


def check_rule_entries(name: str, value: object) -> dict[str, Rule]:
    """{rule: entry} as a manifest records rules (`Run.rules`), or thresholds a caller gives in
    its form ({"ppo": {"low": 0.1, "high": 0.3}}), as Rules (`rule_from_manifest`): every key a
    rule name, every entry a mapping of RULE_FIELDS, an entry without a measure a built-in rule,
    thresholds finite and ≥ 0. Errors name `name` and the rule. A run's own record (`Run.rules`, a
    `RecordedRules`) is read leniently: unknown fields are ignored and an entry that cannot be
    rebuilt is left out, each with a warning."""
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{name} must be a mapping {{rule: {{'low': …, 'high': …}}}}, got {type(value).__name__} {value!r:.80}"
        )
    recorded = isinstance(value, RecordedRules)
    out = {}
    for rule, entry in value.items():
        check_str(f"{name} key", rule)
        if not recorded:
            check_keys(f"{name}[{rule!r}]", entry, RULE_FIELDS)
            out[rule] = rule_from_manifest(rule, entry)
            continue
        # a run's own record (`Run.rules`): read as any reader of a run reads it
        if not isinstance(entry, Mapping):
            warnings.warn(f"{name}: the run's record of rule {rule!r} is not a mapping; rule left out", stacklevel=3)
            continue
        unknown = sorted(str(k) for k in entry if k not in RULE_FIELDS)
        if unknown:
            warnings.warn(
                f"{name}: rule {rule!r} records fields this version does not know, ignored: {unknown}", stacklevel=3
            )
        try:
            out[rule] = rule_from_manifest(rule, {k: v for k, v in entry.items() if k in RULE_FIELDS})
        except ValueError as err:
            warnings.warn(f"{name}: rule {rule!r} left out: {err.args[0]}", stacklevel=3)
    return out


__all__ = ["RULE_FIELDS", "RunOrTokens", "check_rule_entries", "lazy_rows", "require_run", "token_rows"]
