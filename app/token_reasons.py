"""Why the token inspector's response has the blocked tokens it has: per blocked token, the
quantity its rule compares and the threshold it crossed, shown under the response (not only on
hover)."""

from __future__ import annotations

import contextlib
import math

import polars as pl
from safe_display import number

from trustlens.rules import rule_from_manifest
from trustlens.run import blocked_column


def block_reasons(tokens: pl.DataFrame, rule: str, spec: dict, *, mu_recorded: bool) -> pl.DataFrame:
    """The tokens `rule` blocks, each with the quantity its rule compares (run.json's `measure`:
    the ratio π/μ against 1 + high or 1 − low, or a divergence against high or low), the threshold
    its advantage's sign selects (A > 0: high, A < 0: low) and that sign. A rule anchored on π_old
    in a run with μ compares quantities the token rows do not hold (their columns are against μ).
    An entry written before run.json kept the measure is completed from the registry, as every
    analysis reads it (`rule_from_manifest`)."""
    with contextlib.suppress(ValueError):  # a custom rule recorded without its measure: the hover says more
        spec = rule_from_manifest(rule, spec).manifest_entry()
    measure = spec.get("measure")
    per_response = spec.get("statistic") is not None  # a sequence rule: `sequence_reasons` says why
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
                "why": "its whole response is blocked (the response's sequence ratio: see above)"
                if per_response
                else f"{measure} = {number(value, 3)} {side} {number(limit, 3)}"
                if column and limit is not None
                else f"{measure} (not recorded in the token rows: see the hover)",
            }
        )
    return pl.DataFrame(rows, schema={"pos": pl.Int32, "token": pl.String, "advantage": pl.String, "why": pl.String})


def sequence_reasons(tokens: pl.DataFrame, specs: dict) -> pl.DataFrame:
    """For each recorded sequence rule (`specs`: Run.rules) with a decision in `tokens` (the rows of
    one response in one update): its statistic (trustlens.rules.sequence), the sequence ratio s
    from the response's recorded sums, the band [1 − low, 1 + high] and whether the rule blocked
    the whole response. Empty when the rows hold no per-response statistics."""
    from trustlens.rules.columns import ColumnInputs
    from trustlens.rules.sequence import statistic_columns

    rows = []
    for name, spec in specs.items():
        with contextlib.suppress(ValueError, TypeError):
            rule = rule_from_manifest(name, spec)
            column = blocked_column(name)
            reads = statistic_columns(rule)
            if rule.level != "sequence" or column not in tokens.columns or tokens.is_empty():
                continue
            if any(c not in tokens.columns or tokens[c][0] is None for c in reads):
                continue
            first = tokens.row(0, named=True)
            log_s = float(ColumnInputs(lambda c: tokens[c].head(1).to_numpy()).sequence_log_ratio(rule)[0])
            what = "geometric mean" if rule.statistic == "mean" else "product"
            ratio = "π_old/μ" if rule.policy == "old" else f"π/{'π_old' if rule.anchor == 'old' else 'μ'}"
            assert rule.low is not None and rule.high is not None  # a sequence rule blocks
            rows.append(
                {
                    "rule": name,
                    "statistic": f"{what} of {ratio} over {int(first['seq_tokens'])} tokens",
                    "s": number(math.exp(log_s) if log_s == log_s else None, 6),
                    "band": f"[{number(1 - rule.low, 6)}, {number(1 + rule.high, 6)}]",
                    "decision": "blocks the whole response" if first[column] else "passes",
                }
            )
    schema = {"rule": pl.String, "statistic": pl.String, "s": pl.String, "band": pl.String, "decision": pl.String}
    return pl.DataFrame(rows, schema=schema)
