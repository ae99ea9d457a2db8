"""The Doctor panel of the Overview page: `trustlens doctor`'s findings on the chosen run, most
severe first, each with its fix and example tokens that open the token inspector on their
response (docs/doctor.md)."""

from __future__ import annotations

import polars as pl
import streamlit as st
from page_parts import inspect_tokens
from run_cache import RUN_TTL, run_at
from safe_display import dataframe, md, number
from sidebar import Context

from trustlens.analysis import doctor

ICONS = {"problem": ":material/error:", "warning": ":material/warning:", "ok": ":material/check_circle:"}
EXAMPLES = 3  # example tokens offered per finding


@st.cache_data(ttl=RUN_TTL, max_entries=16, show_spinner="Running the doctor's checks…")
def findings(path: str, signature: tuple) -> list[dict]:
    """The doctor's findings on the run (as `Finding.to_json`), cached per run version."""
    return [f.to_json() for f in doctor(run_at(path, signature))]


def doctor_panel(ctx: Context) -> None:
    """The findings that are not ok, each in a box with its fix and example tokens; every check's
    verdict in an expander."""
    st.subheader("Doctor")
    st.caption(
        "Log-probability bugs that fake a training–inference mismatch (raw log-probs, truncated sampling, "
        "shifted positions, sentinels, token ids) and where the mismatch sits, over the whole run "
        "(the sidebar's filters do not apply). Statistics and thresholds: docs/doctor.md."
    )
    found = findings(*ctx.key)
    flagged = [f for f in found if f["verdict"] != "ok"]
    if not flagged:
        st.success(f"All {len(found)} checks ok.", icon=ICONS["ok"])
    for i, f in enumerate(flagged):
        with st.container(border=True):
            st.markdown(f"{ICONS[f['verdict']]} **{md(f['verdict'])}** · {md(f['check'])} · {md(f['summary'])}")
            if f["fix"]:
                st.caption(f"Likely fix: {md(f['fix'])}")
            examples = f["evidence"].get("examples") or []
            if examples:
                cols = st.columns(min(len(examples), EXAMPLES))
            for j, ex in enumerate(examples[:EXAMPLES]):
                label = f"step {ex['step']} · sample {ex['sample']} · pos {ex['pos']}"
                cols[j].caption(f"token {md(repr(ex['token']))}: μ {number(ex['mu'])}, π_old {number(ex['old'])}")
                if cols[j].button(label, key=f"doctor_{i}_{j}", icon=":material/search:"):
                    inspect_tokens(
                        reason=f"doctor {f['check']}: position {ex['pos']} of this response",
                        step=ex["step"],
                        sample=ex["sample"],
                    )
    with st.expander("Every check"):
        dataframe(pl.DataFrame([{k: f[k] for k in ("check", "verdict", "summary")} for f in found]))


__all__ = ["doctor_panel"]
