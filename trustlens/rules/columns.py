"""The trust-region rules (`trustlens.rules`) decided on the columns of a recorded run: numpy and
polars, no torch, for the analyses and the dashboard (a rule the run did not record, or one with
other thresholds, decided again on every token). The decision is `trustlens.rules.decide`, the
function the recorder uses, so a rule decided here agrees with the recorder's decision.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import polars as pl

from trustlens.core.logspace import LOGP_TOLERANCE
from trustlens.rules.batch import select
from trustlens.rules.decision import RuleInputs, _eps
from trustlens.rules.registry import get_rule
from trustlens.rules.resolve import RuleSpec, resolve_rules
from trustlens.rules.rule import Anchor, Rule
from trustlens.rules.sequence import SEQUENCE_COLUMNS, statistic_columns

# The run's column each input of a token rule is read from; the μ anchor's column is a parameter.
_COLUMN_OF = {"old_logp": "old_logp", "topk_tv": "topk_tv", "topk_kl": "topk_kl"}
_LOGP_COLUMNS = ("pi_logp", "mu_logp", "old_logp")


def rule_columns(rule: str | Rule, *, mu: str = "mu_logp") -> tuple[str, ...]:
    """The run columns `evaluate_columns` reads to decide `rule`, μ read from column `mu`: a
    sequence rule reads its response's statistics (trustlens.rules.sequence) instead of π_old."""
    rule = get_rule(rule)
    if rule.level == "sequence":
        return ("pi_logp", "advantage", *statistic_columns(rule))
    anchor = [mu] if rule.anchor == "mu" else []
    return ("pi_logp", *anchor, "advantage", *(_COLUMN_OF[n] for n in rule.needs if n in _COLUMN_OF))


def check_rule_columns(rule: Rule, names: list[str] | tuple[str, ...], *, mu: str = "mu_logp") -> tuple[str, ...]:
    """`rule_columns(rule)`, or ValueError naming the rule and the columns `names` lacks; for a
    sequence rule, what to record to have them. A batch rule is never decided again from the
    columns: ValueError (`not_redecidable`)."""
    not_redecidable(rule)
    cols = rule_columns(rule, mu=mu)
    missing = [c for c in cols if c not in names]
    if not missing:
        return cols
    if any(c in SEQUENCE_COLUMNS for c in missing):
        raise ValueError(
            f"rules: {rule.name!r} decides per response and needs the per-response column(s) {missing} "
            f"({'; '.join(f'{c}: {SEQUENCE_COLUMNS[c]}' for c in missing)}), which the token table lacks: "
            "record the run with TokenRecorder, which writes them (with old_logp for seq_logratio_old)"
        )
    raise ValueError(f"rules: {rule.name!r} needs the column(s) {missing}, which the token table lacks")


def not_redecidable(rule: Rule) -> None:
    """ValueError naming `rule` when it is a batch rule (trustlens.rules.batch): its selection is
    a share of all the tokens of a `record` call, which the stored rows of a run need not all
    hold (a run sampled with `Keep` dropped some), so it is decided only when recorded."""
    if rule.level == "batch":
        raise ValueError(
            f"rules: {rule.name!r} selects a share of each record call's tokens by covariance (a batch rule), "
            "so it cannot be decided again from recorded rows, with these or other thresholds; "
            "pass it to TokenRecorder(rules=...) to record its decision"
        )


def evaluate_columns(
    rules: RuleSpec,
    columns: pl.DataFrame | Mapping[str, Any],
    *,
    mu: str = "mu_logp",
) -> pl.DataFrame:
    """Every rule's decision on the columns of a recorded run, without torch.

    rules: as `evaluate_all` takes them, including `Run.rules` (the manifest's, custom rules too).
    columns: a polars DataFrame (or a mapping of column name to numpy array / polars Series)
        holding the token columns the rules read (`rule_columns`): pi_logp, advantage, the μ
        column `mu` (default "mu_logp"; pass "old_logp" for a run recorded without μ, whose
        μ-anchored rules were anchored on π_old), and where rules need them old_logp, topk_tv,
        topk_kl.
    Returns a DataFrame with one Boolean column per rule, named by the rule, in the order given,
    one row per input row: True = blocked, null where an input the rule reads is null. The
    decision is `decide`, the function the recorder uses, computed in float64 (binary_kl reads a
    log-prob of 0 with the epsilon of the column's own dtype, as the recorder did). ValueError for
    a missing column (naming it and the rule), NaN, positive log-probabilities or negative
    divergences, and for a batch rule (`not_redecidable`).
    """
    resolved = resolve_rules(rules)
    for rule in resolved:
        not_redecidable(rule)
    frame = columns if isinstance(columns, pl.DataFrame) else pl.DataFrame(dict(columns))
    read: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # column -> (float64 values, not null)

    def column(name: str, rule: Rule) -> tuple[np.ndarray, np.ndarray]:
        if name not in read:
            if name not in frame.columns:
                if name in SEQUENCE_COLUMNS:
                    check_rule_columns(rule, frame.columns, mu=mu)  # raises, saying what to record
                raise ValueError(f"rule {rule.name!r} reads the column {name!r}, which columns lacks")
            series = frame[name]
            valid = series.is_not_null().to_numpy()
            values = series.cast(pl.Float64).fill_null(0.0).to_numpy()
            _check_column(name, values, valid)
            read[name] = (values, valid)
        return read[name]

    distances: dict[tuple[str, str, str], np.ndarray] = {}
    eps = _eps(frame.schema.get("pi_logp") == pl.Float64)  # binary_kl's reading of log π = 0, as the recorder's
    out = {}
    for rule in resolved:
        valid = np.logical_and.reduce([column(n, rule)[1] for n in rule_columns(rule, mu=mu)])  # reads them
        blocked = decide_columns(rule, lambda name: read[name][0], mu, distances, eps)
        out[rule.name] = pl.Series(rule.name, blocked, dtype=pl.Boolean).set(pl.Series(~valid), None)
    return pl.DataFrame(out, height=frame.height) if out else pl.DataFrame(height=frame.height)


class ColumnInputs(RuleInputs):
    """The inputs of the rules on the numpy columns of a recorded run (`RuleInputs`, numpy):
    `column(name)` returns the run column `name` (pi_logp, advantage, old_logp, topk_tv, topk_kl,
    the per-response statistics of a sequence rule; μ from the column `mu`), read only where a
    rule reads it. eps: as in `logspace.binary_kl`. `distances`, keyed (measure, anchor column,
    policy), may hold some already computed (the recorder hands in the binary TV and KL it
    stores). A batch rule (trustlens.rules.batch) takes the rows as the whole batch, in row-major
    (b, t) order, and `seed`, the batch's (step, update), seeds Clip-Cov's draw."""

    def __init__(
        self,
        column: Callable[[str], np.ndarray],
        mu: str = "mu_logp",
        distances: dict[tuple[str, str, str], np.ndarray] | None = None,
        eps: float = float(np.finfo(np.float32).eps),
        seed: tuple[int, int] = (0, 0),
    ) -> None:
        self.xp, self.column, self.mu, self.eps, self.seed = np, column, mu, eps, seed
        self.distances = {} if distances is None else distances

    # read when a rule reads them: the dashboard's rows of one response may hold no pi_logp
    pi_logp = property(lambda self: self.column("pi_logp"))
    advantages = property(lambda self: self.column("advantage"))

    def anchor_key(self, anchor: Anchor) -> str:
        return self.mu if anchor == "mu" else "old_logp"

    def anchor_logp(self, anchor: Anchor) -> np.ndarray:
        return self.column(self.anchor_key(anchor))

    def divergence(self, measure: str) -> np.ndarray:
        return self.column(measure)

    def statistic(self, name: str) -> np.ndarray:
        return self.column(name).astype(np.float64)

    def blocked(self, rule: Rule) -> np.ndarray:
        with np.errstate(all="ignore"):  # log(0) = −inf and inf − inf = NaN are handled in the math
            return super().blocked(rule)

    def batch_selection(self, rule: Rule, clipped: np.ndarray | None) -> np.ndarray:
        pick = select(rule, self.pi_logp.astype(np.float64), self.advantages.astype(np.float64), clipped, self.seed)
        return pick if clipped is None else pick | clipped


def decide_columns(
    rule: Rule,
    column: Callable[[str], np.ndarray],
    mu: str,
    distances: dict[tuple[str, str, str], np.ndarray],
    eps: float,
    seed: tuple[int, int] = (0, 0),
) -> np.ndarray:
    """`decide` for `rule` on numpy columns: `ColumnInputs(column, mu, distances, eps, seed).blocked(rule)`."""
    return ColumnInputs(column, mu, distances, eps, seed).blocked(rule)


def _check_column(name: str, values: np.ndarray, valid: np.ndarray) -> None:
    """ValueError naming the column and the first offending row: NaN anywhere; for
    log-probabilities, +inf or values above LOGP_TOLERANCE; for divergences, −inf or values below
    −LOGP_TOLERANCE (+inf is a valid KL); for advantages, ±inf."""
    if name in ("seq_logratio_mu", "seq_logratio_old"):
        return  # every sum is valid: ±inf where one policy gave a token probability 0, NaN where both did
    if name == "seq_tokens":
        bad, what = ~(values >= 1), "a token count < 1"
    elif name in _LOGP_COLUMNS:
        bad, what = ~(values <= LOGP_TOLERANCE), "a value that is not a log-probability (NaN or > 0)"
    elif name == "advantage":
        bad, what = ~np.isfinite(values), "NaN or inf"
    else:
        bad, what = ~(values >= -LOGP_TOLERANCE), "NaN or a negative divergence"
        if name == "topk_tv":
            bad |= values == math.inf
    bad &= valid
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"column {name!r} holds {what} at row {row}: {values[row]!r}")


__all__ = [
    "ColumnInputs",
    "check_rule_columns",
    "decide_columns",
    "evaluate_columns",
    "not_redecidable",
    "rule_columns",
]
