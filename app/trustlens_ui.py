"""What every page of the dashboard shares: the run picker and filters in the sidebar, cached
access to runs and queries, download buttons, and safe display of untrusted text.

The view (run, step range; the page is the URL's path) lives in the address: the sidebar reads
`?run=…&steps=lo-hi` when a session starts (a reload, a shared link) and writes the current
choice back, so a link shows what its sender saw. Widget values are also kept in plain session
state, which Streamlit keeps when a page switch drops widget state.

No analysis happens here: queries are `trustlens.analysis` functions, figures `trustlens.plots`;
this module only caches their results per run version and lays them out.
"""

from __future__ import annotations

import importlib
import io
import math
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import polars as pl
import streamlit as st

from trustlens.analysis import tokens as tq
from trustlens.analysis.buckets import bucket_table
from trustlens.analysis.clipping import with_rules
from trustlens.analysis.collapse import detect_collapse
from trustlens.analysis.signals import step_signals
from trustlens.analysis.summary import exact_aggregates
from trustlens.dashboard import RUNS_ENV
from trustlens.render import FORMULA_START, escape_markdown, visible_token
from trustlens.run import MANIFEST, PART_GLOB, NoRowsError, Run, load_run, load_runs
from trustlens.run.storage import Remote, is_url, local_path

# A run or runs folder: a local path, or a location on an object store.
Location = Path | Remote

# Session-state keys shared by the pages.
CONTEXT_KEY = "tl_context"  # the Context of the current script run
INSPECT_KEY = "tl_inspect"  # what the token inspector should open (see inspect_tokens)
# Most rows a download holds: a browser download of millions of rows helps nobody.
MAX_DOWNLOAD_ROWS = 1_000_000
# Seconds a cached run stays valid; part files added later change the run's signature anyway.
RUN_TTL = 600


# Host names the dashboard answers to besides the address it was started on: a request naming
# any other host (DNS rebinding: a hostile page whose name resolves to 127.0.0.1) gets an error.
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})


def host_of(header: str | None) -> str:
    """The host name of a Host header ("name:port", "[v6]:port" or "name"), lower case."""
    host = (header or "").strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_allowed(header: str | None, configured: tuple[str | None, ...] = ()) -> bool:
    """Whether a request's Host header names this machine or an address the dashboard was
    configured with (`--server.address`, `--browser.serverAddress`). No header at all (no HTTP
    request: Streamlit's AppTest) names no foreign host."""
    if header is None:
        return True
    host = host_of(header)
    allowed = LOCAL_HOSTS | {host_of(c) for c in configured if c}
    return host in allowed or host.endswith(".localhost")


def md(text: object) -> str:
    """Untrusted text made inert for st.markdown / labels (see trustlens.render.escape_markdown)."""
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


def runs_root() -> Location | None:
    """The folder the dashboard was started on ($TRUSTLENS_RUNS: a local folder or an object-store
    URL such as s3://bucket/prefix), else the shipped sample run."""
    env = os.environ.get(RUNS_ENV)
    if env:
        return Remote.of(env) if is_url(env) else local_path(env)
    from trustlens.dashboard import default_runs

    try:
        return default_runs()
    except FileNotFoundError:
        return None


@st.cache_resource(ttl=30, max_entries=4, show_spinner=False)
def run_dirs(root: str) -> list[Location]:
    """The run directories at or below `root` (re-listed every 30 s or on "Reload runs")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [run.path for run in load_runs(root)]


def folder_exists(root: Location) -> bool:
    """Whether the runs folder exists (on an object store: whether any object is below it)."""
    return root.exists() if isinstance(root, Remote) else root.is_dir()


def run_label(root: Location, path: Location) -> str:
    """How the run picker names the run at `path`: its path below the runs folder `root`."""
    if path == root:
        return path.name
    if isinstance(path, Remote) and isinstance(root, Remote):
        return path.path[len(root.path) :].strip("/")
    assert isinstance(path, Path) and isinstance(root, Path)
    return str(path.relative_to(root))


def run_signature(path: Location) -> tuple:
    """Changes whenever the run changes in storage: the manifest's and part files' sizes and
    times (ETags on an object store). Used as a cache key so that a run still being written
    shows its new steps."""
    if isinstance(path, Remote):
        path.fs.invalidate_cache(path.path)
        found = path.fs.find(path.path, detail=True)
        return tuple(
            (key[len(path.path) :], int(info.get("size") or 0), str(info.get("ETag") or info.get("mtime")))
            for key, info in sorted(found.items())
            if key.endswith((MANIFEST, ".parquet"))
        )
    files = [path / MANIFEST, *sorted(path.glob(f"*/{PART_GLOB}"))]
    return tuple((str(f.relative_to(path)), s.st_size, s.st_mtime_ns) for f in files if (s := _stat(f)) is not None)


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


@st.cache_resource(ttl=RUN_TTL, max_entries=16, show_spinner=False)
def open_run(path: str, signature: tuple) -> tuple[Run, list[str]]:
    """The Run at `path` (lazy tables) and the warnings loading it raised (skipped corrupt part
    files), cached per on-disk signature."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = load_run(path)
    return run, [str(w.message) for w in caught]


def run_at(path: str, signature: tuple) -> Run:
    """The cached Run at `path` (for cached queries, which take (path, signature) as their key)."""
    return open_run(path, signature)[0]


def tokens_of(run: Run) -> pl.LazyFrame | None:
    """The run's token table, or None when it has no token rows yet."""
    try:
        return run.tokens
    except NoRowsError:
        return None


@st.cache_data(ttl=RUN_TTL, max_entries=64, show_spinner=False)
def run_shape(path: str, signature: tuple) -> tuple[str, tuple[int, int] | None]:
    """The run's anchor column and step range (None: no token rows yet)."""
    run, _ = open_run(path, signature)
    tokens = tokens_of(run)
    if tokens is None:
        return "mu_logp", None
    mu = {"mu": True, "old": False}.get(str(run.manifest.get("anchor")), run.manifest.get("mu_recorded"))
    return tq.anchor_column(tokens, mu_recorded=mu), tq.step_range(tokens)


@st.cache_data(ttl=RUN_TTL, max_entries=256, show_spinner=False)
def _on_tokens(
    name: str,
    path: str,
    signature: tuple,
    query: tq.TokenQuery | None,
    anchor: str,
    kwargs: tuple,
    decided: tuple[str, ...] = (),
    exact: bool = False,
):
    module, func = name.rsplit(".", 1)
    fn = getattr(importlib.import_module(module), func)
    run = run_at(path, signature)
    tokens = run.tokens
    if decided:
        tokens = with_rules(tokens, decided, base=run.rules)
    if query is not None:
        tokens = tq.filter_tokens(tokens, query, anchor=anchor)
    options = dict(kwargs)
    if exact:
        options["aggregates"] = exact_aggregates(run, None if query is None else query.steps)
    return fn(tokens, **options)


def on_tokens(fn, ctx: Context, *, filtered: bool = True, decided: tuple[str, ...] = (), **kwargs):
    """`fn(tokens, **kwargs)` for an analysis query `fn`, on the run's token rows (those passing
    the sidebar filters unless `filtered` is False), cached per run version, filters and kwargs.
    `decided`: rules the run did not record, decided on its columns first (analysis.with_rules)."""
    query = ctx.query if filtered and ctx.query != tq.TokenQuery() else None
    name = f"{fn.__module__}.{fn.__qualname__}"
    return _on_tokens(name, *ctx.key, query, ctx.anchor, tuple(sorted(kwargs.items())), tuple(decided))


def on_steps(fn, ctx: Context):
    """`fn(tokens, aggregates=...)` for a per-step analysis taking a sampled run's exact aggregates
    (step_summary, blocked_per_step, mismatch_per_step), on the filtered token rows: exact for all
    tokens while the sidebar filters steps only (`Context.exact`), else estimated from the kept
    rows. A run that recorded every token is exact either way."""
    query = ctx.query if ctx.query != tq.TokenQuery() else None
    name = f"{fn.__module__}.{fn.__qualname__}"
    return _on_tokens(name, *ctx.key, query, ctx.anchor, (), (), ctx.exact)


def decidable_rules(ctx: Context) -> list[str]:
    """Blocking rules of the registry the run did not record but whose inputs it holds: they can
    be decided on its columns (analysis.with_rules) and compared with the recorded ones."""
    from trustlens.rule_columns import rule_columns
    from trustlens.rules import RULES

    names = set(ctx.tokens.collect_schema().names()) if ctx.tokens is not None else set()
    return [
        name
        for name, rule in RULES.items()
        if rule.blocks and name not in ctx.rules and set(rule_columns(rule, mu=ctx.anchor)) <= names
    ]


@st.cache_data(ttl=RUN_TTL, max_entries=32, show_spinner=False)
def signals_and_alerts(path: str, signature: tuple) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The run's per-step collapse signals and its alerts (on the whole run, unfiltered)."""
    run = run_at(path, signature)
    signals = step_signals(run)
    return signals, detect_collapse(run, signals=signals)


@dataclass
class Context:
    """The run and the filters chosen in the sidebar, handed to the page being shown."""

    root: Location  # the folder the dashboard was started on (a local folder or an object-store URL)
    runs: list[Location]  # every run found under it
    path: Location  # the chosen run
    signature: tuple  # its on-disk signature (cache key)
    run: Run  # the chosen run, loaded
    tokens: pl.LazyFrame | None  # its token table (None: no token rows yet)
    rules: list[str]  # rules evaluated in the run
    anchor: str  # "mu_logp", or "old_logp" when μ was not recorded
    steps: tuple[int, int] | None  # the run's step range (None: no token rows yet)
    query: tq.TokenQuery = field(default_factory=tq.TokenQuery)  # the sidebar's filters

    @property
    def table(self) -> pl.LazyFrame:
        """The token table, on pages that `need_tokens` (NoRowsError when there is none)."""
        return self.run.tokens

    @property
    def shown_steps(self) -> tuple[int, int]:
        """The steps the sidebar shows: its range, else the whole run (pages that `need_tokens`)."""
        steps = self.query.steps or self.steps
        if steps is None:
            raise NoRowsError(f"run {self.path.name} has no token rows yet")
        return steps

    @property
    def exact(self) -> bool:
        """Whether per-step numbers of a sampled run come from its exact aggregates: the sidebar
        filters steps only (a token filter leaves only the kept rows to count)."""
        return self.run.sampled and replace(self.query, steps=None) == tq.TokenQuery()

    @property
    def key(self) -> tuple[str, tuple]:
        """(path, signature): the first arguments of every cached query of this run."""
        return str(self.path), self.signature

    @property
    def anchor_name(self) -> str:
        return "μ" if self.anchor == "mu_logp" else "π_old"


def context() -> Context | None:
    """The Context the entry script built for this run of the page (None: nothing to show)."""
    return st.session_state.get(CONTEXT_KEY)


def sidebar() -> Context | None:
    """Draw the run picker and the shared filters; return the Context, or None after explaining
    on the page why there is nothing to show (no runs, unreadable run)."""
    root = runs_root()
    if root is None or not folder_exists(root):
        st.warning("No runs folder. Start the dashboard with `trustlens dashboard RUNS_DIR`.")
        return None
    runs = run_dirs(str(root))
    if not runs:
        st.info(f"No recorded runs in {md(root)} yet: a run is a folder holding {MANIFEST}.")
        return None
    sb = st.sidebar
    names = [run_label(root, p) for p in runs]
    _restore("tl_run", st.query_params.get("run"), lambda v: v in names)
    name = sb.selectbox("Run", names, key="tl_run", on_change=_remember, args=("tl_run",))
    _remember("tl_run")
    st.query_params["run"] = name
    path = runs[names.index(name)]
    signature = run_signature(path)
    run, problems = open_run(str(path), signature)
    for problem in problems:
        st.warning(md(problem))
    tokens = tokens_of(run)
    rules = tq.rules_of(tokens) if tokens is not None else list(run.rules)
    anchor, steps = run_shape(str(path), signature)
    ctx = Context(root, runs, path, signature, run, tokens, rules, anchor, steps)
    if sb.button("Reload runs", help="Read the runs folder again (new runs, new steps)"):
        st.cache_resource.clear()
        st.cache_data.clear()
        st.rerun()
    if steps is None:
        return ctx
    ctx.query = _filters(ctx)
    with sb.expander("Download the filtered token rows"):
        download_buttons(tq.filter_tokens(ctx.table, ctx.query, anchor=anchor), f"{path.name}-tokens", "tl_rows")
    return ctx


def _filters(ctx: Context) -> tq.TokenQuery:
    """The shared filter widgets; their values persist across pages (keys in session state)."""
    sb = st.sidebar
    sb.subheader("Filters")
    lo, hi = ctx.shown_steps
    _restore("tl_steps", _steps_param(st.query_params.get("steps")), lambda v: lo <= v[0] <= v[1] <= hi)
    _keep_valid("tl_rule", lambda v: v is None or v in ctx.rules)
    if lo < hi:
        steps = sb.slider("Steps", lo, hi, (lo, hi), key="tl_steps", on_change=_remember, args=("tl_steps",))
        _remember("tl_steps")
        if steps == (lo, hi):
            st.query_params.pop("steps", None)
        else:
            st.query_params["steps"] = f"{steps[0]}-{steps[1]}"
    else:
        sb.caption(f"Step {lo} (the only step so far)")
        steps = (lo, hi)
    rule = sb.selectbox(
        "Rule",
        [None, *ctx.rules],
        format_func=lambda r: "any" if r is None else r,
        key="tl_rule",
        help="Keep tokens by this rule's decision",
    )
    if rule is not None:
        blocked = sb.radio(
            "Decision",
            [True, False],
            horizontal=True,
            key="tl_blocked",
            format_func=lambda b: "blocked" if b else "not blocked",
        )
    buckets = {(r["p_lo"], r["p_hi"]): r["label"] for r in bucket_table().iter_rows(named=True)}
    bucket = sb.selectbox(
        f"{ctx.anchor_name} probability",
        [None, *buckets],
        key="tl_bucket",
        format_func=lambda b: "any" if b is None else buckets[b],
        help="Probability the anchor policy gave the sampled token (log-spaced buckets)",
    )
    sign = sb.selectbox(
        "Advantage", [None, *tq.ADVANTAGE_SIGNS], key="tl_sign", format_func=lambda s: "any sign" if s is None else s
    )
    text = sb.text_input(
        "Token text contains",
        key="tl_text",
        max_chars=200,
        help="Literal, case-insensitive search in the decoded token text",
    )
    decisions = ((rule, blocked),) if rule is not None else ()
    # the whole run is no step filter: queries then share their cache with unfiltered ones
    return tq.TokenQuery(
        steps=None if steps == (lo, hi) else steps,
        decisions=decisions,
        anchor_prob=bucket,
        advantage_sign=sign,  # type: ignore[arg-type]  # one of tq.ADVANTAGE_SIGNS or None
        text=text or None,
    )


def _steps_param(value: str | None) -> tuple[int, int] | None:
    """A step range from the address ("lo-hi"), None when absent or malformed."""
    try:
        lo, hi = (int(v) for v in (value or "").split("-", 1))
    except ValueError:
        return None
    return lo, hi


def _remember(key: str) -> None:
    """Copy a widget's value to plain session state (kept when a page switch drops widget state)."""
    if key in st.session_state:
        st.session_state[f"_{key}"] = st.session_state[key]


def _restore(key: str, from_url: object, valid) -> None:
    """Before drawing widget `key`: give it the value remembered in this session, else the
    address's value (a reload or shared link), when that value fits the run shown."""
    if key in st.session_state and valid(st.session_state[key]):
        return
    for candidate in (st.session_state.get(f"_{key}"), from_url):
        if candidate is not None and valid(candidate):
            st.session_state[key] = candidate
            return
    st.session_state.pop(key, None)


def _keep_valid(key: str, valid) -> None:
    """Forget a widget's remembered value when it does not fit the run now shown (another run
    was picked): the widget then starts from its default."""
    if key in st.session_state and not valid(st.session_state[key]):
        del st.session_state[key]


def header(title: str, ctx: Context) -> None:
    """The page title, the run's name and status, and the anchor note when μ is absent."""
    st.title(title)
    status = ctx.run.status
    st.caption(f"Run {md(ctx.path.name)} · status {md(status)} · {len(ctx.rules)} rules evaluated")
    if status == "running":
        st.info("This run is still being written: use **Reload runs** in the sidebar to see new steps.")
    if ctx.anchor == "old_logp":
        st.info(
            "μ (the rollout policy) was not recorded in this run: the anchor is π_old, "
            "so ratios, divergences and buckets compare π with π_old."
        )
    if ctx.run.sampled:
        keep = ctx.run.manifest.get("keep") or {}
        numbers = (
            "The per-step numbers (token counts, block rates, A = 0 share, token-level mismatch) are exact, "
            "from the run's aggregates of all tokens; token-level views are drawn from the kept rows"
            if ctx.exact
            else "With a token filter in the sidebar, every number here is an estimate from the kept rows"
        )
        st.info(
            f"Sampled run: the token rows are every token that matters (blocked by a rule, μ < "
            f"{number(keep.get('low_mu'))}, non-finite or top divergences) plus a {number(keep.get('rate'))} share "
            f"of the rest, each with its `weight`. {numbers}, where rates and counts weigh each row by its "
            "`weight` (docs/run-format.md)."
        )


def need_tokens(ctx: Context | None) -> Context:
    """Stop the page with a message unless there is a run with token rows."""
    if ctx is None:
        st.stop()
    if ctx.steps is None:
        st.info("This run has no token rows yet.")
        st.stop()
    return ctx


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


def dataframe(df: pl.DataFrame, **kwargs) -> None:
    """st.dataframe of `shown(df)` (kwargs go to st.dataframe; hide_index by default)."""
    kwargs.setdefault("hide_index", True)
    st.dataframe(shown(df), **kwargs)


def csv_safe(df: pl.DataFrame) -> pl.DataFrame:
    """`df` with every text cell a spreadsheet would run as a formula (starting with =, +, -, @,
    tab or CR) prefixed with an apostrophe, so it opens as text (trustlens.render.csv_cell)."""
    text = [c for c, t in df.schema.items() if t in (pl.String, pl.Categorical)]
    fixes = []
    for c in text:
        col = pl.col(c).cast(pl.String)
        risky = pl.any_horizontal(col.str.starts_with(ch) for ch in FORMULA_START)
        fixes.append(pl.when(risky).then(pl.lit("'") + col).otherwise(col).alias(c))
    return df.with_columns(fixes) if fixes else df


def download_buttons(rows: pl.LazyFrame, name: str, key: str) -> None:
    """CSV and Parquet download buttons for `rows` (at most MAX_DOWNLOAD_ROWS), built on click.
    The CSV's text cells are neutralised against spreadsheet formulas (`csv_safe`)."""

    def frame() -> pl.DataFrame:
        return rows.head(MAX_DOWNLOAD_ROWS).collect()

    def csv() -> bytes:
        return csv_safe(frame()).write_csv().encode()

    def parquet() -> bytes:
        buf = io.BytesIO()
        frame().write_parquet(buf)
        return buf.getvalue()

    st.download_button(
        "Download CSV",
        csv,
        file_name=f"{name}.csv",
        mime="text/csv",
        key=f"{key}_csv",
        on_click="ignore",
        icon=":material/download:",
    )
    st.download_button(
        "Download Parquet",
        parquet,
        file_name=f"{name}.parquet",
        mime="application/vnd.apache.parquet",
        key=f"{key}_parquet",
        on_click="ignore",
        icon=":material/download:",
    )
    st.caption(f"Downloads hold the filtered rows (at most {MAX_DOWNLOAD_ROWS:,}).")


def inspect_tokens(**target) -> None:
    """Open the token inspector on `target`: the click-through used by alerts and charts.
    Keys: reason (shown), query (a TokenQuery replacing the sidebar's), and optionally step and
    sample (the response to show first) and alert (whose driving tokens are listed)."""
    st.session_state[INSPECT_KEY] = target
    st.switch_page(INSPECTOR, query_params=view_params())


def view_params() -> dict[str, str]:
    """The address's view parameters now (run, steps), to carry across a page switch."""
    return {k: st.query_params[k] for k in ("run", "steps") if k in st.query_params}


def multiselect_in_address(label: str, options: dict[str, str], *, key: str, param: str, default: list[str]) -> list:
    """A multiselect over `options` (value -> shown name) whose choice lives in the address as
    repeated `param` parameters holding the shown names (`?compare=a&compare=b`), restored on
    reload and shared links like the sidebar's run."""
    by_name = {name: value for value, name in options.items()}
    from_url = [by_name[n] for n in st.query_params.get_all(param) if n in by_name] or None
    _restore(key, from_url, lambda v: all(x in options for x in v))
    if key not in st.session_state:
        st.session_state[key] = default
    chosen = st.multiselect(
        label, list(options), format_func=lambda v: options[v], key=key, on_change=_remember, args=(key,)
    )
    _remember(key)
    st.query_params[param] = [options[v] for v in chosen]
    return chosen


INSPECTOR = "views/token_inspector.py"
SEVERITY_ICONS = {"critical": ":material/error:", "warning": ":material/warning:"}


def alert_list(ctx: Context, alerts: pl.DataFrame, *, limit: int = 20, key: str = "alerts") -> None:
    """The alerts within the sidebar's step range, most severe first, each with a button that
    opens the token inspector on the tokens and samples behind it."""
    lo, hi = ctx.shown_steps
    shown = alerts.filter((pl.col("end_step") >= lo) & (pl.col("step") <= hi))
    if shown.is_empty():
        st.success("No collapse alerts in these steps.")
        return
    shown = shown.sort(pl.col("severity") == "critical", "step", descending=[True, False])
    for i, alert in enumerate(shown.head(limit).iter_rows(named=True)):
        with st.container(border=True):
            left, right = st.columns([5, 1], vertical_alignment="center")
            icon = SEVERITY_ICONS.get(alert["severity"], "")
            left.markdown(f"{icon} **{md(alert['severity'])}** · {md(alert['kind'])} · {md(alert['message'])}")
            if right.button("Inspect tokens", key=f"{key}_{i}", icon=":material/search:"):
                samples = alert["samples"] or []
                inspect_tokens(
                    reason=f"alert: {alert['message']}",
                    query=tq.alert_query(alert),
                    alert=alert,
                    step=alert["step"],
                    sample=samples[0] if samples else None,
                )
    if shown.height > limit:
        st.caption(f"{shown.height - limit} more alerts: see Collapse signals.")


def chart(fig, key: str, *, ctx: Context | None = None) -> None:
    """Show a plotly figure; with `ctx` (for charts whose x axis is the step), a control under it
    opens the token inspector on one step's filtered tokens.

    Not plotly's own click selection: Streamlit cannot select points of line traces, and on
    figures with subplots its selection events make the page rerun over and over
    (streamlit/streamlit#8766)."""
    st.plotly_chart(fig, key=key)
    if ctx is None:
        return
    lo, hi = ctx.shown_steps
    _keep_valid(f"{key}_step", lambda v: lo <= v <= hi)
    with st.popover("Inspect the tokens of a step", icon=":material/search:"):
        step = st.number_input("Step", min_value=lo, max_value=hi, value=hi, key=f"{key}_step")
        if st.button("Open in the token inspector", key=f"{key}_inspect"):
            inspect_tokens(reason=f"step {step} of the chart", query=replace(ctx.query, steps=(step, step)))
