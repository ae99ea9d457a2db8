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
from trustlens.rules.decision import Rule, RuleSpec, _distance, _eps, decide, get_rule, resolve_rules

# The run's column each input of a rule is read from; the μ anchor's column is a parameter.
_COLUMN_OF = {"old_logp": "old_logp", "topk_tv": "topk_tv", "topk_kl": "topk_kl"}
_LOGP_COLUMNS = ("pi_logp", "mu_logp", "old_logp")


def rule_columns(rule: str | Rule, *, mu: str = "mu_logp") -> tuple[str, ...]:
    """The run columns `evaluate_columns` reads to decide `rule`, μ read from column `mu`."""
    rule = get_rule(rule)
    anchor = [mu] if rule.anchor == "mu" else []
    return ("pi_logp", *anchor, "advantage", *(_COLUMN_OF[n] for n in rule.needs))


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
    divergences.
    """
    resolved = resolve_rules(rules)
    frame = columns if isinstance(columns, pl.DataFrame) else pl.DataFrame(dict(columns))
    read: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # column -> (float64 values, not null)

    def column(name: str, rule: Rule) -> tuple[np.ndarray, np.ndarray]:
        if name not in read:
            if name not in frame.columns:
                raise ValueError(f"rule {rule.name!r} reads the column {name!r}, which columns lacks")
            series = frame[name]
            valid = series.is_not_null().to_numpy()
            values = series.cast(pl.Float64).fill_null(0.0).to_numpy()
            _check_column(name, values, valid)
            read[name] = (values, valid)
        return read[name]

    distances: dict[tuple[str, str], np.ndarray] = {}
    eps = _eps(frame.schema.get("pi_logp") == pl.Float64)  # binary_kl's reading of log π = 0, as the recorder's
    out = {}
    for rule in resolved:
        valid = np.logical_and.reduce([column(n, rule)[1] for n in rule_columns(rule, mu=mu)])  # reads them
        blocked = decide_columns(rule, lambda name: read[name][0], mu, distances, eps)
        out[rule.name] = pl.Series(rule.name, blocked, dtype=pl.Boolean).set(pl.Series(~valid), None)
    return pl.DataFrame(out, height=frame.height) if out else pl.DataFrame(height=frame.height)


def decide_columns(
    rule: Rule,
    column: Callable[[str], np.ndarray],
    mu: str,
    distances: dict[tuple[str, str], np.ndarray],
    eps: float,
) -> np.ndarray:
    """`decide` for `rule` on numpy columns: `column(name)` returns the run column `name`
    (pi_logp, advantage, old_logp, topk_tv, topk_kl; μ from the column `mu`), all of one dtype.
    Each computed distance is kept in `distances`, keyed (measure, anchor column), so that rules
    sharing it compute it once; the caller may hand some in already computed (the recorder hands
    in the binary TV and KL it stores). eps: as in `_logspace.binary_kl`."""
    pi = column("pi_logp")
    if not rule.blocks:
        return decide(rule, None, pi, None, None)
    anchor_name = mu if rule.anchor == "mu" else "old_logp"
    anchor = column(anchor_name)
    if rule.measure in ("topk_tv", "topk_kl"):
        d = column(str(rule.measure))
    else:
        key = (str(rule.measure), anchor_name)
        if key not in distances:
            with np.errstate(all="ignore"):  # log(0) = −inf and inf − inf = NaN are handled in the math
                distances[key] = _distance(key[0], pi, anchor, eps, np)
        d = distances[key]
    return decide(rule, d, pi, anchor, column("advantage"))


def _check_column(name: str, values: np.ndarray, valid: np.ndarray) -> None:
    """ValueError naming the column and the first offending row: NaN anywhere; for
    log-probabilities, +inf or values above LOGP_TOLERANCE; for divergences, −inf or values below
    −LOGP_TOLERANCE (+inf is a valid KL); for advantages, ±inf."""
    if name in _LOGP_COLUMNS:
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


__all__ = ["decide_columns", "evaluate_columns", "rule_columns"]
