"""A run still being written, live: the page shows "live · step N · updated X s ago" above it, the app
checks the run in storage every LIVE_SECONDS seconds and reruns when it changed (a Streamlit
fragment, so that the check alone redraws nothing; the rerun keeps the page, the filters and the
address), and a new alert shows as a toast. A run that is not `running` does not poll, nor does
one whose writer died (it still says `running`, but no writer holds it: `run_cache.run_stopped`,
the test `trustlens watch` uses): the line then says "stopped updating N s ago", and a run whose
writer dies while shown turns so at the next check.

The check asks for the run's on-disk signature (`run_cache.run_signature`: the sizes and times of
run.json and the part files), the same key every cached query of the run is computed under: a
rerun after a change computes the pages' queries on the new version, an unchanged run costs one
listing.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict

import streamlit as st
from run_cache import Location, run_signature, run_stopped
from run_queries import signals_and_alerts
from safe_display import md
from sidebar import Context

from trustlens.live import live_alerts
from trustlens.run.follow import updated_seconds_ago
from trustlens.run.manifest import read_manifest

# Seconds between two checks of a run being written for new part files.
LIVE_SECONDS = 3
# Session-state key: run path -> the alerts already shown for it, (kind, step, severity).
SEEN_KEY = "tl_live_alerts"
# What a toast shows before an alert of each severity.
TOAST_ICONS = {"critical": ":material/error:", "warning": ":material/warning:"}


def badge(ctx: Context | None) -> None:
    """Above the page: the live line of a run still being written, checked every LIVE_SECONDS
    seconds; nothing for a closed run (which is not polled)."""
    if ctx is None or ctx.run.status != "running":
        return
    where = "no steps yet" if ctx.steps is None else f"step {ctx.steps[1]}"
    if ctx.stopped is not None:
        st.markdown(f":orange-badge[:material/stop_circle: stopped] {where} · {md(ctx.stopped)}")
        return
    _live(ctx.path, ctx.signature, where)


@st.fragment(run_every=LIVE_SECONDS)
def _live(path: Location, signature: tuple, where: str) -> None:
    """Rerun the app when the run changed in storage or its writer died; else say how fresh it is."""
    if run_signature(path) != signature:
        st.rerun(scope="app")
    manifest: dict = {}
    with contextlib.suppress(ValueError, OSError):  # mid-replace: the next check reads it
        manifest = read_manifest(path)
    if run_stopped(path, manifest) is not None:
        st.rerun(scope="app")
    ago = updated_seconds_ago(manifest)
    when = "" if ago is None else f" · updated {ago:.0f} s ago"
    st.markdown(f":green-badge[:material/radio_button_checked: live] {where}{when}")


def toast_new_alerts(ctx: Context | None) -> None:
    """Show each warning or critical alert that appeared since this session last showed the run
    as a toast: the alerts the recorder raised live (the run's alerts table) when it keeps them,
    else those `detect_collapse` finds on the run as it stands. The alerts a run had when first
    shown are on its pages, not toasted; a run opened after it closed is not followed."""
    if ctx is None or ctx.tokens is None:
        return
    seen: dict[str, set[tuple]] = st.session_state.setdefault(SEEN_KEY, {})
    key = str(ctx.path)
    if ctx.run.status != "running" and key not in seen:
        return
    now = {(a["kind"], a["step"], a["severity"]): a for a in _alerts(ctx)}
    if key in seen:
        for found, alert in now.items():
            if found not in seen[key] and alert["severity"] in TOAST_ICONS:
                live = " (raised live)" if alert["live"] else ""
                st.toast(
                    f"**{md(alert['severity'])} alert**{live} at step {alert['step']}: {md(alert['kind'])} · "
                    f"{md(alert['message'])}",
                    icon=TOAST_ICONS[alert["severity"]],
                )
    seen[key] = set(now)


def _alerts(ctx: Context) -> list[dict]:
    """The run's collapse alerts as {kind, step, severity, message, live}."""
    recorded = [a for a in live_alerts(ctx.run) if a.source == "collapse"]
    if recorded:
        return [{**asdict(a), "live": True} for a in recorded]
    return [{**a, "live": False} for a in signals_and_alerts(*ctx.key)[1].iter_rows(named=True)]
