"""Safe display of untrusted values on the dashboard's pages: token and prompt text made inert
for markdown, numbers, tables with visible whitespace, and downloads whose CSV a spreadsheet
opens as text."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import polars as pl
import streamlit as st

from trustlens.core.render import csv_safe, escape_markdown, visible_token

# Most rows a download holds: a browser download of millions of rows helps nobody.
MAX_DOWNLOAD_ROWS = 1_000_000


def md(text: object) -> str:
    """Untrusted text made inert for st.markdown / labels (see trustlens.core.render.escape_markdown)."""
    return escape_markdown(str(text))


def number(value: object, digits: int = 4) -> str:
    """A value for display: `digits` significant digits for numbers, ∞ for an infinite one (a KL
    where π gave the token probability 0 is +inf: a value), "n/a" for none, else escaped text."""
    if value is None:
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "∞" if value > 0 else "−∞"
    if isinstance(value, (int, float)):
        return f"{value:.{digits}g}"
    return md(value)


# Columns holding token text: shown with visible whitespace in every table.
TOKEN_COLUMNS = ("token",)


def shown(df: pl.DataFrame):
    """`df` as a table shows it: token text with visible whitespace (␣ ⇥ ↵, so " the" and "the"
    differ), categoricals as text, converted to pandas through Arrow here rather than by
    st.dataframe (no polars→pandas conversion holding the GIL under Streamlit's lock)."""
    fixes = [
        pl.Series(c, [visible_token(t) for t in df[c].cast(pl.String).to_list()], dtype=pl.String)
        for c in TOKEN_COLUMNS
        if c in df.columns
    ]
    fixes += [df[c].cast(pl.String) for c, t in df.schema.items() if t == pl.Categorical and c not in TOKEN_COLUMNS]
    return (df.with_columns(fixes) if fixes else df).to_arrow().to_pandas()


def dataframe(df: pl.DataFrame, *, percent: Sequence[str] = (), **kwargs) -> None:
    """st.dataframe of `shown(df)`, the columns named in `percent` (fractions: block rates,
    shares) shown as percentages (kwargs go to st.dataframe; hide_index by default)."""
    kwargs.setdefault("hide_index", True)
    config = {c: st.column_config.NumberColumn(format="percent") for c in percent}
    st.dataframe(shown(df), column_config={**config, **kwargs.pop("column_config", {})}, **kwargs)


def download_buttons(rows: pl.LazyFrame, name: str, key: str) -> None:
    """CSV and Parquet download buttons for `rows` (at most MAX_DOWNLOAD_ROWS), built on click.
    The CSV's text cells are neutralised against spreadsheet formulas
    (trustlens.core.render.csv_safe)."""

    def frame() -> pl.DataFrame:
        return rows.head(MAX_DOWNLOAD_ROWS).collect()

    def csv() -> bytes:
        return csv_safe(frame()).write_csv().encode()

    def parquet() -> bytes:
        buf = io.BytesIO()
        frame().write_parquet(buf)
        return buf.getvalue()

    for label, data, ext, mime in (
        ("CSV", csv, "csv", "text/csv"),
        ("Parquet", parquet, "parquet", "application/vnd.apache.parquet"),
    ):
        st.download_button(
            f"Download {label}",
            data,
            file_name=f"{name}.{ext}",
            mime=mime,
            key=f"{key}_{ext}",
            on_click="ignore",
            icon=":material/download:",
        )
    st.caption(f"Downloads hold the filtered rows (at most {MAX_DOWNLOAD_ROWS:,}).")
