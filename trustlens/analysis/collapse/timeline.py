"""A run's story in time order: its first collapse signal, the alerts that followed, and the
collapse itself if it came.

`run_timeline` turns the alerts of `trustlens.analysis.collapse.detect_collapse` and the
collapse of `trustlens.analysis.collapse.onset.collapse_onset` into one table, one row per event, ordered
by step (an alert at its first step, ties: critical first, then by kind; the collapse after the
alerts of its step):

    event          what
    first signal   the earliest warning or critical alert
    then           every later warning or critical alert
    note           an "info" alert (an entropy change while the run learns): context, not a signal
    collapse       the collapse step and its cause (held-out accuracy below half its first
                   evaluation, or the trailing mean reward below half the first window's)

Each alert row keeps its row index in the alerts table (`alert`), whose `tokens` and `samples`
are its driving tokens (`trustlens.analysis.collapse.drivers`).
"""

from __future__ import annotations

import polars as pl

from trustlens.analysis.collapse.onset import accuracy_per_step, collapse_onset, collapse_window, reward_per_step

TIMELINE_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "step": pl.Int32,  # the alert's first step, or the collapse step
    "event": pl.String,  # "first signal", "then", "note" or "collapse"
    "kind": pl.String,  # the alert's detector, or the collapse's cause ("accuracy", "reward")
    "severity": pl.String,  # the alert's severity; "collapse" for the collapse
    "message": pl.String,  # one line for people
    "alert": pl.Int32,  # row of the alert in the alerts table (null for the collapse)
}

COLLAPSE_MESSAGES = {
    "accuracy": "the run collapsed: held-out accuracy fell below half its first evaluation",
    "reward": "the run collapsed: the trailing mean reward fell below half the first window's",
}


def episode_span(alert: dict) -> str:
    """An alert episode's severity over time, for people: "warning at steps 20–59, critical from
    step 60 to 250 · evidence from step 20" (`alert`: a row of detect_collapse or
    LiveAlert.record())."""
    start, end, critical = alert["step"], alert["end_step"], alert.get("critical_step")
    first = "info" if alert["severity"] == "info" else "warning"
    if critical is None:
        text = f"{first} at step {start}" if start == end else f"{first} at steps {start}–{end}"
    elif critical == start:
        text = f"critical from step {start} to {end}"
    else:
        text = f"warning at steps {start}–{critical - 1}, critical from step {critical} to {end}"
    evidence = alert.get("evidence_start_step")
    if critical is not None and evidence is not None and evidence < start:
        text += f" · evidence from step {evidence} ({', '.join(alert.get('evidence') or [])})"
    return text


def run_timeline(run, alerts: pl.DataFrame) -> pl.DataFrame:
    """The events of `run` in time order (columns: TIMELINE_SCHEMA; see the module docstring).
    `alerts` is `detect_collapse(run)`."""
    reward = reward_per_step(run)
    onset, cause = collapse_onset(accuracy_per_step(run), reward, collapse_window(len(reward)))
    order = alerts.with_row_index("alert").sort("step", pl.col("severity") != "critical", "kind", maintain_order=True)
    rows, first_seen = [], False
    for a in order.iter_rows(named=True):
        if a["severity"] == "info":
            event = "note"
        else:
            event, first_seen = ("then" if first_seen else "first signal"), True
        rows.append(
            {
                "step": a["step"],
                "event": event,
                "kind": a["kind"],
                "severity": a["severity"],
                "message": a["message"],
                "alert": a["alert"],
            }
        )
    if onset is not None and cause is not None:
        at = sum(1 for r in rows if r["step"] <= onset)
        rows.insert(
            at,
            {
                "step": onset,
                "event": "collapse",
                "kind": cause,
                "severity": "collapse",
                "message": f"step {onset}: {COLLAPSE_MESSAGES[cause]}",
                "alert": None,
            },
        )
    return pl.DataFrame(rows, schema=TIMELINE_SCHEMA)


__all__ = ["TIMELINE_SCHEMA", "episode_span", "run_timeline"]
