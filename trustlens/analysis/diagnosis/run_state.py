"""Whether the run a doctor judged is complete: a killed, interrupted, failed or still-written run
is named as such, so that findings over part of a run are not read as the whole run's."""

from __future__ import annotations

from typing import Any

import polars as pl

from trustlens.run.errors import NoRowsError
from trustlens.run.follow import writer_died


def incomplete_note(run: Any) -> str | None:
    """One line saying that `run` (a Run) is incomplete and what the findings then cover, or None
    for a run that finished (or whose run.json is unreadable: status unknown, warned at load).
    A run whose run.json still says `running` is killed when `writer_died` says so (the test
    `trustlens watch` ends on), else still being written."""
    status, name = run.status, str(run.path)
    if status not in ("running", "interrupted", "failed"):
        return None
    try:
        last = run.tokens.select(pl.col("step").max()).collect().item()
    except NoRowsError:
        last = None
    covers = "no steps" if last is None else f"steps up to {last} only"
    if status == "running":
        why = writer_died(run.path, run.manifest)
        if why is None:
            return (
                f"run {name!r} is still being written: these findings cover {covers}; run the doctor again "
                "when it finishes"
            )
        return (
            f"run {name!r} is incomplete: run.json still says running but {why} (killed or crashed?); these "
            f"findings cover {covers}: resume it (TokenRecorder(..., resume=True)) to record the rest"
        )
    cause = run.manifest.get("error") or run.manifest.get("signal")
    return (
        f"run {name!r} is incomplete: it ended {status}{f' ({cause})' if cause else ''}; these findings cover {covers}"
    )


__all__ = ["incomplete_note"]
