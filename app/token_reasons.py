"""Why the token inspector's response has the blocked tokens it has: per blocked token, the
quantity its rule compares and the threshold it crossed, shown under the response (not only on
hover)."""

from __future__ import annotations

import contextlib

import polars as pl
from safe_display import number

from trustlens.rules import Rule
from trustlens.run import blocked_column


def block_reasons(tokens: pl.DataFrame, rule: str, spec: dict, *, mu_recorded: bool) -> pl.DataFrame:
    """The tokens `rule` blocks, each with the quantity its rule compares (run.json's `measure`:
    the ratio π/μ against 1 + high or 1 − low, or a divergence against high or low), the threshold
    its advantage's sign selects (A > 0: high, A < 0: low) and that sign. A rule anchored on π_old
    in a run with μ compares quantities the token rows do not hold (their columns are against μ).
    An entry written before run.json kept the measure is completed from the registry, as every
    analysis reads it (`Rule.from_manifest`)."""
    with contextlib.suppress(ValueError):  # a custom rule recorded without its measure: the hover says more
        spec = Rule.from_manifest(rule, spec).manifest_entry()
    measure = spec.get("measure")
    blocked = tokens.filter(pl.col(blocked_column(rule)))
    same_anchor = spec.get("anchor") != "old" or not mu_recorded
    column = measure if measure in blocked.columns and same_anchor else None
    low, high = spec.get("low"), spec.get("high")
    if measure == "ratio":
        low, high = (None if low is None else 1 - low), (None if high is None else 1 + high)
    rows = []
    for t in blocked.iter_rows(named=True):
        pos = t["advantage"] > 0
        limit = high if pos else low
        value = t[column] if column else None
        side = ">" if measure != "ratio" or pos else "<"
        rows.append(
            {
                "pos": t["pos"],
                "token": t["token"],
                "advantage": "A > 0" if pos else "A < 0",
                "why": f"{measure} = {number(value, 3)} {side} {number(limit, 3)}"
                if column and limit is not None
                else f"{measure} (not recorded in the token rows: see the hover)",
            }
        )
    return pl.DataFrame(rows, schema={"pos": pl.Int32, "token": pl.String, "advantage": pl.String, "why": pl.String})
