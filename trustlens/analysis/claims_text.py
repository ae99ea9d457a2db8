"""The claims report's text about each run's outcome: how early the collapse alerts came
(`alert_leads`) and the per-run table (`outcome_rows`), both from `run_outcomes` rows."""

from __future__ import annotations

from typing import Any

import polars as pl

from trustlens.analysis.seeds import LINE_MARGIN, over_seeds


def alert_leads(outcomes: pl.DataFrame) -> str:
    """One line: how many collapsing runs got a critical alert before the collapse, the lead
    times, and how many stable runs got a critical alert anyway; then the same counts over the
    runs whose outcome was decided more than LINE_MARGIN standard errors from the collapse line
    (`line_margin`, when `outcomes` has it), when some were within it."""
    leads = outcomes.filter(pl.col("collapse_step").is_not_null())["lead"].to_list()
    listed = ", ".join("–" if v is None else str(v) for v in leads) or "none"
    line = _alerted(outcomes, f" (lead in steps: {listed}; mean {over_seeds([v for v in leads if v is not None])})")
    if "line_margin" not in outcomes.columns:
        return line
    near = outcomes.filter(pl.col("line_margin") <= LINE_MARGIN)
    if near.is_empty():
        return line
    clear = outcomes.filter(pl.col("line_margin") > LINE_MARGIN)
    return (
        f"{line}. {near.height} of the {outcomes.height} runs came within {LINE_MARGIN:g} standard errors of "
        "the collapse line at their lowest evaluation (another draw of held-out problems could well turn "
        f"their outcome); over the {clear.height} others, {_alerted(clear)}"
    )


def _alerted(outcomes: pl.DataFrame, leads: str = "") -> str:
    """ "a/b collapsing runs had a critical alert before the collapse`leads`; c/d runs that did
    not collapse had a critical alert"."""
    col = outcomes.filter(pl.col("collapse_step").is_not_null())
    stable = outcomes.filter(pl.col("collapse_step").is_null())
    warned = sum(v is not None and v >= 1 for v in col["lead"].to_list())
    false = int(stable["first_critical"].is_not_null().sum())
    return (
        f"{warned}/{col.height} collapsing runs had a critical alert before the collapse{leads}; "
        f"{false}/{stable.height} runs that did not collapse had a critical alert"
    )


def outcome_rows(outcomes: pl.DataFrame) -> list[str]:
    """A Markdown table of `outcomes` (`run_outcomes`), one row per run, by rule then seed: held-out
    accuracy at the start, the end, its lowest and its best, how far the final accuracy level is
    below the best one (acc_drop, against its noise: ✓ within), the collapse step (and cause),
    the first step at which an alert was critical (and its kind) and the lead (collapse step −
    that step)."""

    def cell(v: Any) -> str:
        return "–" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    rows = [
        "| rule | seed | start | final | lowest | best | best − final level (noise) | collapse at step "
        "| first critical alert | lead |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {r: i for i, r in enumerate(outcomes["rule"].unique(maintain_order=True).to_list())}
    for o in sorted(outcomes.iter_rows(named=True), key=lambda o: (order[o["rule"]], o["seed"] is None, o["seed"])):
        collapse = "–" if o["collapse_step"] is None else f"{o['collapse_step']} ({o['collapse_cause']})"
        critical = "–" if o["first_critical"] is None else f"{o['first_critical']} ({o['first_critical_kind']})"
        accuracy = [cell(o[k]) for k in ("acc_start", "acc_final", "acc_lowest", "acc_best")]
        drop = cell(o["acc_drop"])
        if o["acc_drop_noise"] is not None:
            drop += f" ({o['acc_drop_noise']:.3f}{' ✓' if o['within_noise'] else ''})"
        rows.append(
            f"| {o['rule']} | {cell(o['seed'])} | {' | '.join(accuracy)} | {drop} | {collapse} | "
            f"{critical} | {cell(o['lead'])} |"
        )
    return rows


__all__ = ["alert_leads", "outcome_rows"]
