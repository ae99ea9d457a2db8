"""The trustlens dashboard: `trustlens dashboard [RUNS_DIR]` runs `streamlit run` on this file.

The sidebar (run picker and filters) is drawn here, once, so that every page shares it; each
page reads the resulting Context from session state. At most busy.RUNNING_AT_ONCE page runs
compute at once; the others show that the dashboard is busy and wait their turn (app/busy.py).

Nothing leaves the machine: the page icon is the local `icon.png` and pages carry no icons of
their own (Streamlit would fetch a page's material icon as the favicon from a font host). A
request whose Host header names neither this machine nor the configured address (a DNS
rebinding page) is answered with an error and nothing else.
"""

from pathlib import Path

import busy
import streamlit as st
from host_check import host_allowed
from view_state import unknown_page


def show(page, asked: str | None) -> None:
    """The sidebar and `page` (`asked`: the page path the address named when it names none). The
    app's heavy modules are imported here, once a page run's turn has come (busy.in_turn), so that
    a tab opened on a fresh, loaded server says at once that it waits."""
    import live
    import page_data
    import polars as pl
    import pyarrow as pa
    from safe_display import md
    from sidebar import CONTEXT_KEY, context, sidebar

    if asked is not None:
        names = ", ".join(f"/{p.url_path}" if p.url_path else "/ (Overview)" for p in PAGES)
        st.warning(f"No page at /{md(asked)}: showing the {page.title} instead. The pages: {names}.")
    # A run can be unreadable (a corrupt part file, a foreign schema): say so instead of crashing.
    try:
        st.session_state[CONTEXT_KEY] = sidebar()
        live.badge(context())
        page.run()
        live.toast_new_alerts(context())
        page_data.warm_up(context())
    except (OSError, ValueError, KeyError, pl.exceptions.PolarsError, pa.ArrowException) as err:
        st.error(f"Could not read this run: {md(err)}")


st.set_page_config(page_title="trustlens", page_icon=str(Path(__file__).with_name("icon.png")), layout="wide")

configured = (st.get_option("server.address"), st.get_option("browser.serverAddress"))
if not host_allowed(st.context.headers.get("Host"), configured):
    st.error(
        "This dashboard only answers requests addressed to this machine (localhost, 127.0.0.1) "
        "or to the address it was started with (trustlens dashboard --host)."
    )
    st.stop()

PAGES = [
    st.Page("views/overview.py", title="Overview", default=True),
    st.Page("views/token_inspector.py", title="Token inspector"),
    st.Page("views/ppo_vs_dppo.py", title="PPO vs DPPO"),
    st.Page("views/mismatch.py", title="Mismatch"),
    st.Page("views/collapse.py", title="Collapse signals"),
    st.Page("views/compare.py", title="Compare runs"),
]
asked = unknown_page(PAGES)
page = st.navigation(PAGES)
st.sidebar.title("trustlens")
with busy.in_turn():  # a bounded number of page runs compute at once; the others say the dashboard is busy
    show(page, asked)
