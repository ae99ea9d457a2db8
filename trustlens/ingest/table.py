"""A Log's values as the run's metrics table (step, name, value), under trustlens' names.

- Names: `trustlens.metrics.trustlens_name(framework, name)`; a name the table does not know is
  kept as logged. Two logged names the table maps to one trustlens name (verl's accuracy of two
  data sources) give, at a step that has both, their mean, with a warning naming them.
- Values: numbers (an int, a float, ±inf and NaN included) are imported; a value that is not a
  number (text, a list, a table) is not, with one warning per name saying how many were left out;
  a missing value (null) is no value.
- Steps: a step below 0 is left out with a warning. A name logged at steps out of order is
  sorted by step, and a name logged twice at a step (a resumed run, a second writer) keeps the
  value logged last; each with one warning giving an example.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import polars as pl

from trustlens.ingest.sources import ImportWarning, Log
from trustlens.metrics import FRAMEWORKS, framework_entry, trustlens_name

SCHEMA = {"step": pl.Int32, "name": pl.String, "value": pl.Float64}


@dataclass
class Table:
    """The metrics table of a log and what became of its names."""

    metrics: pl.DataFrame  # step, name, value (SCHEMA), sorted by step then name
    renamed: dict[str, str] = field(default_factory=dict)  # logged name -> trustlens name, where they differ
    kept: list[str] = field(default_factory=list)  # logged names the framework's table does not know: kept as logged


def _warn(text: str) -> None:
    warnings.warn(text, ImportWarning, stacklevel=3)


def _examples(items: list[str], n: int = 3) -> str:
    more = f" and {len(items) - n} more" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def numeric(log: Log) -> tuple[list[int], list[str], list[float]]:
    """The log's numeric values (steps, names, values), warning once per name about the rest."""
    steps, names, values = log.steps, log.names, log.values
    if all(type(v) is float for v in values):  # event files: nothing to sort out
        return steps, names, values
    keep_s: list[int] = []
    keep_n: list[str] = []
    keep_v: list[float] = []
    bad: dict[str, list] = {}
    for s, n, v in zip(steps, names, values, strict=True):
        if isinstance(v, int | float):  # a bool is a number too (0 or 1)
            keep_s.append(s)
            keep_n.append(n)
            keep_v.append(float(v))
        elif v is not None:
            bad.setdefault(n, []).append(v)
    for n, vs in bad.items():
        _warn(
            f"metric {n!r} holds {len(vs)} values that are not numbers (e.g. {str(vs[0])[:40]!r}): "
            "they are not imported"
        )
    return keep_s, keep_n, keep_v


def metrics_table(log: Log, framework: str | None) -> Table:
    """The metrics table of `log` with `framework`'s names mapped (module docstring)."""
    steps, names, values = numeric(log)
    frame = pl.DataFrame(
        {"order": pl.int_range(0, len(steps), eager=True), "step": steps, "tag": names, "value": values},
        schema={"order": pl.Int64, "step": pl.Int64, "tag": pl.String, "value": pl.Float64},
    )
    negative = frame.filter(pl.col("step") < 0)
    if negative.height:
        _warn(
            f"{negative.height} values at steps below 0 (e.g. {negative['tag'][0]!r} at step "
            f"{negative['step'][0]}) are not imported"
        )
        frame = frame.filter(pl.col("step") >= 0)
    top = int(frame["step"].max() or 0) if frame.height else 0  # type: ignore[arg-type]
    if top > 2**31 - 1:
        raise ValueError(f"{log.path}: step {top} does not fit the run format's int32 steps")
    back = frame.with_columns(pl.col("step").cum_max().over("tag").shift(1).over("tag").alias("before")).filter(
        pl.col("step") < pl.col("before")
    )
    if back.height:
        tags = back["tag"].unique(maintain_order=True).to_list()
        first = back.row(0, named=True)
        _warn(
            f"{len(tags)} metrics logged steps out of order (e.g. {first['tag']!r}: step {first['step']} after step "
            f"{first['before']}): sorted by step"
        )
    twice = frame.group_by("step", "tag").agg(pl.len().alias("n"), pl.col("order").min()).filter(pl.col("n") > 1)
    if twice.height:
        first = twice.sort("order").row(0, named=True)
        _warn(
            f"{twice.height} (step, metric) pairs logged more than once (e.g. {first['tag']!r} at step "
            f"{first['step']}, {first['n']} times): the value logged last is kept"
        )
        frame = frame.sort("order").unique(["step", "tag"], keep="last")
    tags = frame["tag"].unique().sort().to_list()
    mapped = {t: trustlens_name(framework, t) for t in tags}
    table = Table(pl.DataFrame(schema=SCHEMA))
    table.renamed = {t: n for t, n in mapped.items() if t != n}
    table.kept = tags if framework not in FRAMEWORKS else [t for t in tags if framework_entry(framework, t) is None]
    frame = frame.with_columns(pl.col("tag").replace_strict(mapped, return_dtype=pl.String).alias("name"))
    groups: dict[str, list[str]] = {}
    for t, n in mapped.items():
        groups.setdefault(n, []).append(t)
    shared = {n: ts for n, ts in groups.items() if len(ts) > 1}
    for n, ts in shared.items():
        _warn(f"{len(ts)} logged names are all {n!r} ({_examples(ts)}): a step that has several gets their mean")
    out = (
        frame.group_by("step", "name").agg(pl.col("value").mean()) if shared else frame.select("step", "name", "value")
    )
    table.metrics = out.select(pl.col("step").cast(pl.Int32), "name", "value").sort("step", "name")
    return table


__all__ = ["SCHEMA", "Table", "metrics_table", "numeric"]
