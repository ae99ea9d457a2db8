"""Scanning a run's part files into polars LazyFrames (`scan_files`: polars' reader for local
files, a pyarrow dataset over fsspec on an object store), conforming parts whose columns differ
from the run's to its columns (`conform`, with a RunWarning naming the files and the columns), and
the token columns a sampled run derives rather than stores (`with_derived`). The reader
(trustlens.run.reader) builds `Run`'s tables from them."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from types import FrameType

import polars as pl
import pyarrow as pa

from trustlens.core import logspace
from trustlens.run.errors import RunWarning
from trustlens.run.parts import Location
from trustlens.run.storage import Remote

# token columns a sampled run does not store: they follow from the log-probabilities
# the trustlens package's folder: `warn` attributes a warning to the first caller outside it
_PACKAGE = str(Path(__file__).resolve().parent.parent) + "/"
DERIVED = ("ratio", "binary_tv", "binary_kl")


def with_derived(tokens: pl.LazyFrame) -> pl.LazyFrame:
    """`tokens` with ratio, binary_tv and binary_kl computed from pi_logp and the anchor (μ, else
    π_old) as the recorder computes them (`trustlens.core.logspace.derived_columns`).
    Declared elementwise, so that polars' streaming engine computes it batch by batch (otherwise
    it gathers the whole column first: 16.6 GB for step_summary on a 197M-row run)."""

    def derive(both: pl.Series) -> pl.Series:
        values = logspace.derived_columns(both.struct.field("pi").to_numpy(), both.struct.field("anchor").to_numpy())
        return pl.DataFrame(values).to_struct("derived")

    kind = pl.Struct({name: pl.Float32 for name in DERIVED})
    pair = pl.struct(pi=pl.col("pi_logp"), anchor=pl.coalesce("mu_logp", "old_logp"))
    return (
        tokens.with_columns(pair.map_batches(derive, return_dtype=kind, is_elementwise=True).alias("_derived"))
        .with_columns(*(pl.col("_derived").struct.field(name).alias(name) for name in DERIVED))
        .drop("_derived")
    )


def column_key(schema: pa.Schema) -> tuple[tuple[str, str], ...]:
    """(name, Arrow type) of each column of `schema`: parts with one key scan together."""
    return tuple((f.name, str(f.type)) for f in schema)


# columns without which a row cannot be placed: a part lacking one is skipped, not conformed
KEY_COLUMNS = ("step", "update", "sample", "pos", "name")


def _castable(have: pl.DataType, want: pl.DataType) -> bool:
    """Whether a column read as `have` can stand for one of type `want`: the same type, numbers
    as numbers (a widened or narrowed int or float), text as text (a plain or a dictionary
    string)."""
    text = (pl.String, pl.Categorical)
    return (
        have == want
        or (have.is_numeric() and want.is_numeric())
        or (isinstance(have, text) and isinstance(want, text))
        or (have == pl.Null)
    )


def conform(frame: pl.LazyFrame, target: pl.Schema, files: list[Location], recorded: set[str]) -> pl.LazyFrame | None:
    """`frame` (parts whose columns differ from the run's) in the run's columns `target`: a
    missing column null, an extra one dropped, another type of number or text cast (a value
    the run's type cannot hold becomes null), with a RunWarning naming the files and those
    columns; a column that no part of the run holds (`recorded`: one added by a later trustlens)
    is null without one. Parts that lack a key column (step, update, sample, pos, name) or hold a
    column of another kind (text for a number) are skipped with a RunWarning naming the files:
    None."""
    have = frame.collect_schema()
    named = ", ".join(str(f) for f in files)
    lacking = [c for c in KEY_COLUMNS if c in target and c not in have]
    if lacking:
        warn(f"skipping part file(s) {named}: no column {', '.join(lacking)}")
        return None
    wrong = [f"{c} ({have[c]}, not {t})" for c, t in target.items() if c in have and not _castable(have[c], t)]
    if wrong:
        warn(f"skipping part file(s) {named}: column {', '.join(wrong)}")
        return None
    text = (pl.String, pl.Categorical)
    differ = {
        "missing, read as null": [c for c in target if c not in have and c in recorded],
        "not the run's, dropped": [c for c in have if c not in target],
        "cast to the run's type": [
            f"{c} ({have[c]} to {t})"
            for c, t in target.items()
            if c in have and have[c] not in (t, pl.Null) and not (isinstance(have[c], text) and isinstance(t, text))
        ],
    }
    if any(differ.values()):
        said = "; ".join(f"{what}: {', '.join(cols)}" for what, cols in differ.items() if cols)
        warn(f"part file(s) {named} differ from the run's columns ({said})")
    return frame.select(
        pl.col(c).cast(t, strict=False) if c in have else pl.lit(None, t).alias(c) for c, t in target.items()
    )


def scan_files(files: list[Location]) -> pl.LazyFrame:
    """A LazyFrame over part files: polars' own reader for local files (paths, not patterns);
    a pyarrow dataset over the fsspec filesystem on an object store."""
    if isinstance(files[0], Path):
        return pl.scan_parquet([str(f) for f in files], glob=False, hive_partitioning=False)
    import pyarrow.dataset as ds
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    remote = [f for f in files if isinstance(f, Remote)]
    filesystem = PyFileSystem(FSSpecHandler(remote[0].fs))
    return pl.scan_pyarrow_dataset(ds.dataset([f.path for f in remote], filesystem=filesystem, format="parquet"))


def warn(message: str, category: type[Warning] = RunWarning) -> None:
    """Warn, attributed to the first caller outside the trustlens package (the user's line that
    loaded the run), never to an internal source line."""
    frame: FrameType | None = sys._getframe(1)
    level = 2  # the stacklevel of `frame`, warn's caller
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


__all__ = ["DERIVED", "KEY_COLUMNS", "column_key", "conform", "scan_files", "warn", "with_derived"]
