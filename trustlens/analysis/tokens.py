"""Token-inspector queries over a recorded run's token table (polars, lazy).

Everything the dashboard's token inspector asks of a run: which token rows pass a set of filters
(step range, a rule's decision, the anchor-probability bucket, the advantage's sign, a search in
the token text), which samples those rows belong to, and one sample's tokens in order.

The anchor of a run is μ (`mu_logp`) when the run recorded it; a run without μ (an external
trainer such as TRL) is anchored on π_old (`old_logp`), as its rules were (docs/rules.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import polars as pl

from trustlens.core.argument_checks import check_bool, check_choice, check_int, check_number, check_sequence, check_str
from trustlens.run import blocked_column, rule_of_column

# Advantage signs, named as everywhere in trustlens: pos (A > 0), neg (A < 0), zero (A = 0).
AdvantageSign = Literal["pos", "neg", "zero"]
ADVANTAGE_SIGNS: tuple[str, ...] = ("pos", "neg", "zero")

# Columns of one sample's tokens, in display order (blocked_<rule> columns follow).
SAMPLE_TOKEN_COLUMNS = (
    "step",
    "update",
    "sample",
    "pos",
    "token_id",
    "token",
    "mu_logp",
    "old_logp",
    "pi_logp",
    "ratio",
    "binary_tv",
    "binary_kl",
    "topk_tv",
    "topk_kl",
    "entropy",
    "advantage",
    "seq_logratio_mu",  # the response's statistics, which the sequence rules decide from
    "seq_logratio_old",
    "seq_tokens",
    "route_flips",  # a mixture-of-experts run's routing (trustlens.run.routes)
    "route_first_flip",
    "route_overlap",
    "route_layers",
    "route_mu_experts",
    "route_pi_experts",
)


@dataclass(frozen=True)
class TokenQuery:
    """Filters on token rows; None means "no filter". All given filters must hold (AND)."""

    steps: tuple[int, int] | None = None  # inclusive range of steps
    decisions: tuple[tuple[str, bool], ...] = ()  # (rule, blocked?) pairs that must all hold
    # anchor probability in [lo, hi) ([lo, 1] when hi ≥ 1), e.g. a μ bucket
    anchor_prob: tuple[float, float] | None = None
    advantage_sign: AdvantageSign | None = None  # sign of the token's advantage (null never matches)
    text: str | None = None  # literal, case-insensitive substring of the decoded token text
    samples: tuple[int, ...] | None = None  # keep only these sample ids

    def __post_init__(self) -> None:
        """Each field's kind and shape checked, a TypeError naming it (`TokenQuery.steps`, ...);
        lists kept as tuples. Their values (steps in order, a rule the run evaluated, a sign) are
        checked against the run when the query is used (`query_expr`)."""
        if self.steps is not None:
            lo, hi = _pair("TokenQuery.steps", self.steps, "a (first, last) pair of ints")
            object.__setattr__(
                self, "steps", (check_int("TokenQuery.steps[0]", lo), check_int("TokenQuery.steps[1]", hi))
            )
        decisions = []
        for i, item in enumerate(check_sequence("TokenQuery.decisions", self.decisions, what=_DECISIONS)):
            rule, blocked = _pair(f"TokenQuery.decisions[{i}]", item, "a (rule, blocked) pair")
            decisions.append(
                (
                    check_str(f"TokenQuery.decisions[{i}] rule", rule),
                    check_bool(f"TokenQuery.decisions[{i}] blocked", blocked),
                )
            )
        object.__setattr__(self, "decisions", tuple(decisions))
        if self.anchor_prob is not None:
            lo, hi = _pair("TokenQuery.anchor_prob", self.anchor_prob, "a (lo, hi) pair of probabilities")
            object.__setattr__(
                self,
                "anchor_prob",
                (check_number("TokenQuery.anchor_prob[0]", lo), check_number("TokenQuery.anchor_prob[1]", hi)),
            )
        if self.advantage_sign is not None and not isinstance(self.advantage_sign, str):
            check_choice("TokenQuery.advantage_sign", self.advantage_sign, ADVANTAGE_SIGNS)  # a TypeError
        if self.text is not None:
            check_str("TokenQuery.text", self.text, empty=True)
        if self.samples is not None:
            items = check_sequence("TokenQuery.samples", self.samples, what="a list of sample ids (ints)")
            object.__setattr__(
                self, "samples", tuple(check_int(f"TokenQuery.samples[{i}]", v) for i, v in enumerate(items))
            )


_DECISIONS = "a list of (rule, blocked) pairs"


def _pair(name: str, value: object, what: str) -> tuple[object, object]:
    """`value` as a pair (a tuple or a list of two), else a TypeError naming `name` and `what`."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name} must be {what}, got {type(value).__name__} {value!r:.80}")
    return value[0], value[1]


def rules_of(tokens: pl.LazyFrame) -> list[str]:
    """The rules evaluated in a token table: its `blocked_<rule>` columns, in file order."""
    return [r for r in (rule_of_column(c) for c in tokens.collect_schema().names()) if r is not None]


# How figures and pages name the anchor policy of each anchor column.
ANCHOR_SYMBOLS = {"mu_logp": "μ", "old_logp": "π_old"}


def anchor_column(tokens: pl.LazyFrame, mu_recorded: bool | None = None) -> str:
    """`mu_logp` when the run recorded μ, else `old_logp` (the anchor of a run without μ).

    `mu_recorded` is the manifest's answer when it has one; otherwise the table is asked whether
    any `mu_logp` is non-null.
    """
    names = tokens.collect_schema().names()
    if "mu_logp" not in names:
        return "old_logp"
    if mu_recorded is None:
        mu_recorded = bool(tokens.select(pl.col("mu_logp").is_not_null().any()).collect().item())
    return "mu_logp" if mu_recorded else "old_logp"


def _check_query(query: TokenQuery, rules: Sequence[str]) -> None:
    if query.steps is not None:
        lo, hi = query.steps
        if lo > hi:
            raise ValueError(f"query.steps: first step {lo} is after last step {hi}")
    for rule, _ in query.decisions:
        if rule not in rules:
            raise ValueError(
                f"query.decisions: rule {rule!r} was not evaluated in this run "
                f"(evaluated: {', '.join(rules) or 'none'})"
            )
    if query.anchor_prob is not None:
        p_lo, p_hi = query.anchor_prob
        if not 0.0 <= p_lo < p_hi:
            raise ValueError(f"query.anchor_prob must be 0 ≤ lo < hi, got {query.anchor_prob}")
    if query.advantage_sign is not None and query.advantage_sign not in ADVANTAGE_SIGNS:
        raise ValueError(f"query.advantage_sign must be one of {ADVANTAGE_SIGNS}, got {query.advantage_sign!r}")


def query_expr(query: TokenQuery, *, rules: Sequence[str], anchor: str = "mu_logp") -> pl.Expr:
    """The row predicate of `query` (True where a row passes every filter)."""
    _check_query(query, rules)
    conds: list[pl.Expr] = []
    if query.steps is not None:
        conds.append(pl.col("step").is_between(query.steps[0], query.steps[1], closed="both"))
    if query.samples is not None:
        conds.append(pl.col("sample").is_in(list(query.samples)))
    for rule, blocked in query.decisions:
        col = pl.col(blocked_column(rule))
        conds.append(col if blocked else ~col)
    if query.anchor_prob is not None:
        lo, hi = query.anchor_prob
        prob = pl.col(anchor).exp()
        # [lo, hi), except that an interval reaching 1 holds probability 1 (log-prob 0) too, as the
        # top bucket of trustlens.analysis.buckets does
        conds.append((prob >= lo) & (prob < hi) if hi < 1.0 else prob >= lo)
    if query.advantage_sign is not None:
        adv = pl.col("advantage")
        conds.append({"pos": adv > 0, "neg": adv < 0, "zero": adv == 0}[query.advantage_sign])
    if query.text:
        conds.append(pl.col("token").cast(pl.String).str.to_lowercase().str.contains(query.text.lower(), literal=True))
    return pl.all_horizontal(conds).fill_null(False) if conds else pl.lit(True)


def filter_tokens(tokens: pl.LazyFrame, query: TokenQuery, *, anchor: str = "mu_logp") -> pl.LazyFrame:
    """The token rows that pass `query` (lazy: the step filter prunes row groups)."""
    return tokens.filter(query_expr(query, rules=rules_of(tokens), anchor=anchor))


def sample_summary(rows: pl.LazyFrame, *, limit: int = 500) -> pl.DataFrame:
    """Per (step, update, sample) of `rows`: how many rows match, how many each rule blocks, the
    mean advantage; samples with the most matching rows first (at most `limit`)."""
    rules = rules_of(rows)
    return (
        rows.group_by("step", "update", "sample")
        .agg(
            pl.len().alias("rows"),
            *(pl.col(blocked_column(r)).sum().alias(blocked_column(r)) for r in rules),
            pl.col("advantage").mean().alias("advantage"),
        )
        .sort(["rows", "step", "sample"], descending=[True, False, False])
        .head(limit)
        .collect()
    )


def sample_tokens(
    tokens: pl.LazyFrame, sample: int, *, step: int | None = None, update: int | None = None
) -> pl.DataFrame:
    """One sample's tokens in position order (one update: the given one, else the first recorded).

    Giving `step` lets the scan skip every other step's row groups.
    """
    lf = tokens.filter(pl.col("sample") == sample)
    if step is not None:
        lf = lf.filter(pl.col("step") == step)
    names = lf.collect_schema().names()
    cols = [c for c in SAMPLE_TOKEN_COLUMNS if c in names] + [c for c in names if rule_of_column(c)]
    df = lf.select(cols).collect()
    if df.is_empty():
        return df
    chosen = int(df.select(pl.col("update").min()).item()) if update is None else update
    return df.filter(pl.col("update") == chosen).sort("pos")


def updates_of_sample(tokens: pl.LazyFrame, sample: int, *, step: int | None = None) -> list[int]:
    """The minibatch updates in which `sample` was recorded, ascending."""
    lf = tokens.filter(pl.col("sample") == sample)
    if step is not None:
        lf = lf.filter(pl.col("step") == step)
    return sorted(lf.select(pl.col("update").unique()).collect()["update"].to_list())


def sample_text(samples: pl.LazyFrame, sample: int, *, step: int | None = None) -> dict | None:
    """The samples-table row of `sample` (prompt, response, reward, ...) as a dict, or None."""
    lf = samples.filter(pl.col("sample") == sample)
    if step is not None:
        lf = lf.filter(pl.col("step") == step)
    df = lf.head(1).collect()
    return df.row(0, named=True) if df.height else None


def step_range(tokens: pl.LazyFrame) -> tuple[int, int] | None:
    """(first, last) step of the token table, or None when it has no rows."""
    df = tokens.select(pl.col("step").min().alias("lo"), pl.col("step").max().alias("hi")).collect()
    lo, hi = df.row(0)
    return None if lo is None else (int(lo), int(hi))


def alert_query(alert: dict) -> TokenQuery:
    """The rows behind a collapse alert (a row of `trustlens.analysis.collapse.detect_collapse`):
    the step its drivers were read at (`drivers_step`; its first step where absent), restricted to
    the samples that drove it when it names any."""
    step = int(alert["step"] if alert.get("drivers_step") is None else alert["drivers_step"])
    samples = tuple(int(s) for s in (alert.get("samples") or ()))
    return TokenQuery(steps=(step, step), samples=samples or None)


def alert_tokens(tokens: pl.LazyFrame, alert: dict) -> pl.DataFrame:
    """The exact (sample, update, pos) token rows an alert lists as its drivers, at the step they
    were read at (alert_query), in the alert's order (most extreme first)."""
    listed = alert.get("tokens") or []
    keys = pl.DataFrame(
        {
            "sample": [t["sample"] for t in listed],
            "update": [t["update"] for t in listed],
            "pos": [t["pos"] for t in listed],
            "rank_in_alert": list(range(len(listed))),
        },
        schema={"sample": pl.Int64, "update": pl.Int16, "pos": pl.Int32, "rank_in_alert": pl.Int64},
    )
    step = int(alert["step"] if alert.get("drivers_step") is None else alert["drivers_step"])
    rows = tokens.filter(pl.col("step") == step).join(keys.lazy(), on=["sample", "update", "pos"], how="inner")
    return rows.sort("rank_in_alert").drop("rank_in_alert").collect()
