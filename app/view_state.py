"""The view a page shows, kept in the address and in session state.

The view (run, step range; the page is the URL's path) lives in the address: the sidebar reads
`?run=…&steps=lo-hi` when a session starts (a reload, a shared link) and writes the current
choice back, so a link shows what its sender saw. Widget values are also kept in plain session
state, which Streamlit keeps when a page switch drops widget state.
"""

from __future__ import annotations

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx


def unknown_page(pages: list) -> str | None:
    """The page path the address asks for when it names none of `pages` (`st.Page`s), else None;
    called before `st.navigation`. Such an address is then taken as the default page's, so that
    Streamlit runs that page without its own "Page not found" pop-up (which covers the page's top,
    where the caller says what happened and names the real pages)."""
    ctx = get_script_run_ctx()
    manager = ctx.pages_manager if ctx is not None else None
    asked = manager.intended_page_name if manager is not None else None
    if manager is None or not asked or asked in {page.url_path for page in pages}:
        return None
    if not manager.intended_page_script_hash:  # a page asked by its hash is found (or not) by that
        manager.set_script_intent("", "")
    return asked


def steps_param(value: str | None) -> tuple[int, int] | None:
    """A step range from the address ("lo-hi"), None when absent or malformed."""
    try:
        lo, hi = (int(v) for v in (value or "").split("-", 1))
    except ValueError:
        return None
    return lo, hi


def remember(key: str) -> None:
    """Copy a widget's value to plain session state (kept when a page switch drops widget state)."""
    if key in st.session_state:
        st.session_state[f"_{key}"] = st.session_state[key]


def restore(key: str, from_url: object, valid) -> None:
    """Before drawing widget `key`: give it the value remembered in this session, else the
    address's value (a reload or shared link), when that value fits the run shown."""
    if key in st.session_state and valid(st.session_state[key]):
        return
    for candidate in (st.session_state.get(f"_{key}"), from_url):
        if candidate is not None and valid(candidate):
            st.session_state[key] = candidate
            return
    st.session_state.pop(key, None)


def keep_valid(key: str, valid) -> None:
    """Forget a widget's remembered value when it does not fit the run now shown (another run
    was picked): the widget then starts from its default."""
    if key in st.session_state and not valid(st.session_state[key]):
        del st.session_state[key]


def view_params() -> dict[str, str]:
    """The address's view parameters now (run, steps), to carry across a page switch."""
    return {k: st.query_params[k] for k in ("run", "steps") if k in st.query_params}


def multiselect_in_address(label: str, options: dict[str, str], *, key: str, param: str, default: list[str]) -> list:
    """A multiselect over `options` (value -> shown name) whose choice lives in the address as
    repeated `param` parameters holding the shown names (`?compare=a&compare=b`), restored on
    reload and shared links like the sidebar's run."""
    by_name = {name: value for value, name in options.items()}
    from_url = [by_name[n] for n in st.query_params.get_all(param) if n in by_name] or None
    restore(key, from_url, lambda v: all(x in options for x in v))
    if key not in st.session_state:
        st.session_state[key] = default
    chosen = st.multiselect(
        label, list(options), format_func=lambda v: options[v], key=key, on_change=remember, args=(key,)
    )
    remember(key)
    st.query_params[param] = [options[v] for v in chosen]
    return chosen
