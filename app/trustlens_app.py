"""The trustlens dashboard: `trustlens dashboard [RUNS_DIR]` runs `streamlit run` on this file.

The sidebar (run picker and filters) is drawn here, once, so that every page shares it; each
page reads the resulting Context from session state.
"""

import page_data
import polars as pl
import pyarrow as pa
import streamlit as st
import trustlens_ui as ui

st.set_page_config(page_title="trustlens", page_icon=":material/troubleshoot:", layout="wide")

PAGES = [
    st.Page("views/overview.py", title="Overview", icon=":material/dashboard:", default=True),
    st.Page("views/token_inspector.py", title="Token inspector", icon=":material/text_fields:"),
    st.Page("views/ppo_vs_dppo.py", title="PPO vs DPPO", icon=":material/compare_arrows:"),
    st.Page("views/mismatch.py", title="Mismatch", icon=":material/difference:"),
    st.Page("views/collapse.py", title="Collapse signals", icon=":material/warning:"),
    st.Page("views/compare.py", title="Compare runs", icon=":material/stacked_line_chart:"),
]
page = st.navigation(PAGES)
st.sidebar.title("trustlens")

# A run can be unreadable (a corrupt part file, a foreign schema): say so instead of crashing.
READ_ERRORS = (OSError, ValueError, KeyError, pl.exceptions.PolarsError, pa.ArrowException)
try:
    st.session_state[ui.CONTEXT_KEY] = ui.sidebar()
    page.run()
    page_data.warm_up(ui.context())
except READ_ERRORS as err:
    st.error(f"Could not read this run: {ui.md(err)}")
