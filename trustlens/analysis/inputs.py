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

from typing import TypeAlias

import polars as pl

from trustlens.run.reader import Run

RunOrTokens: TypeAlias = Run | pl.LazyFrame


def _given(value: object) -> str:
    if isinstance(value, pl.DataFrame):
        return "a polars DataFrame (pass df.lazy(), or the Run itself)"
    if isinstance(value, (str, bytes)) or hasattr(value, "__fspath__"):
        return f"the path {value!r} (load it first: trustlens.load_run(path))"
    return f"{type(value).__name__} {value!r:.80}"


def token_rows(
    function: str, source: object, aggregates: pl.LazyFrame | None = None
) -> tuple[pl.LazyFrame, pl.LazyFrame | None]:
    """(token rows, exact aggregates or None) of `source`, a Run or its token rows.

    A Run of a sampled run brings its aggregates, unless `aggregates` is given (it wins); a
    LazyFrame brings only the `aggregates` given. TypeError for anything else."""
    if isinstance(source, Run):
        if aggregates is None and source.sampled:
            aggregates = source.aggregates
        return source.tokens, aggregates
    if isinstance(source, pl.LazyFrame):
        return source, aggregates
    raise TypeError(
        f"{function}: tokens must be a Run (trustlens.load_run) or its token rows (run.tokens, a polars "
        f"LazyFrame), got {_given(source)}"
    )


def lazy_rows(function: str, source: object, name: str = "tokens") -> pl.LazyFrame:
    """The rows of `source` (a Run: its token rows; a LazyFrame as it is), for analyses that
    have no exact form; TypeError for anything else."""
    if isinstance(source, Run):
        return source.tokens
    if isinstance(source, pl.LazyFrame):
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


__all__ = ["RunOrTokens", "lazy_rows", "require_run", "token_rows"]
