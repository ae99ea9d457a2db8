"""Rule decisions counted per response: a sequence rule (docs/rules.md) blocks whole responses,
so its decision is one per response, whatever the response's length.

    responses_blocked(tokens, rules)   per rule: responses, blocked_responses, blocked_frac
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from trustlens.analysis.buckets import checked_rules, collect
from trustlens.analysis.sources import RunOrTokens, lazy_rows
from trustlens.run import blocked_column

# A response in a token table: the rows of one sample in one update of one step.
RESPONSE_KEYS = ("step", "update", "sample")


def responses_blocked(tokens: RunOrTokens, rules: str | Sequence[str] | None = None) -> pl.DataFrame:
    """Per rule: the responses with an A ≠ 0 row where the rule was decided (`responses`), those
    with a blocked row (`blocked_responses`: for a sequence rule, blocked as a whole) and their
    share (`blocked_frac`, null without a response). A response counts once however many of its
    rows are kept or blocked; on a sampled run only responses with a kept row are counted."""
    tokens = lazy_rows("responses_blocked", tokens)
    rules = checked_rules(tokens, rules)
    live = tokens.filter(pl.col("advantage") != 0)
    per_response = live.group_by(RESPONSE_KEYS).agg(
        *(pl.col(blocked_column(r)).is_not_null().any().alias(f"n_{r}") for r in rules),
        *(pl.col(blocked_column(r)).fill_null(False).any().alias(f"k_{r}") for r in rules),
    )
    sums = collect(per_response.select(*(pl.col(c).sum() for r in rules for c in (f"n_{r}", f"k_{r}"))))
    rows = []
    for r in rules:
        n, k = (int(sums[f"{p}_{r}"][0] or 0) for p in ("n", "k"))
        rows.append((r, n, k, k / n if n else None))
    schema = {"rule": pl.String, "responses": pl.Int64, "blocked_responses": pl.Int64, "blocked_frac": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


__all__ = ["RESPONSE_KEYS", "responses_blocked"]
