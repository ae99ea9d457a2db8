"""The runs the dashboard shows: found at or below the runs folder it was started on, opened
lazily and cached per on-disk version (`run_signature`), so that a run still being written shows
its new steps while an unchanged one opens from cache."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import polars as pl
import streamlit as st

from trustlens.analysis import tokens as tq
from trustlens.analysis.collapse.logged import metrics_only
from trustlens.dashboard import RUNS_ENV
from trustlens.live.watch import DEFAULT_STALE
from trustlens.run import MANIFEST, PART_GLOB, NoRowsError, Run, load_run, load_runs
from trustlens.run.follow import updated_seconds_ago, writer_died
from trustlens.run.manifest import read_manifest
from trustlens.run.storage import Remote, is_url, local_path

# A run or runs folder: a local path, or a location on an object store.
Location = Path | Remote

# Seconds a cached run stays valid; part files added later change the run's signature anyway.
RUN_TTL = 600


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


def run_stopped(path: Location, manifest: dict) -> str | None:
    """For a run whose run.json (`manifest`, as read) says running: how it stopped being written,
    in the words of `trustlens watch` ("stopped updating N s ago: it still says running but no
    writer holds it (its writer died?)"), by watch's test (`writer_died`, with its default
    --stale) asked once more on run.json read after the first answer, as watch polls once more
    (a run that closed in between is not stopped); None while it is written or closed."""
    if manifest.get("status") != "running" or writer_died(path, manifest, stale=DEFAULT_STALE) is None:
        return None
    try:
        manifest = read_manifest(path)
    except (ValueError, OSError):  # mid-replace: the next look reads it
        return None
    why = writer_died(path, manifest, stale=DEFAULT_STALE)
    if why is None:
        return None
    ago = updated_seconds_ago(manifest)
    when = "" if ago is None else f" {ago:.0f} s ago"
    return f"stopped updating{when}: it still says running but {why} (its writer died?)"


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
    if tokens is None and metrics_only(run):  # imported: the steps it logged metrics at
        lo, hi = run.metrics.select(pl.col("step").min(), pl.col("step").max().alias("hi")).collect().row(0)
        return "mu_logp", None if lo is None else (int(lo), int(hi))
    if tokens is None:
        return "mu_logp", None
    mu = {"mu": True, "old": False}.get(str(run.manifest.get("anchor")), run.manifest.get("mu_recorded"))
    return tq.anchor_column(tokens, mu_recorded=mu), tq.step_range(tokens)
