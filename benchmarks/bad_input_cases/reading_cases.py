"""Reading runs: load_run and load_runs given no path, a file, a foreign folder, and runs with one
part or run.json corrupted (a corrupted part loses its rows with a warning naming it, never the
run)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from bad_input_cases import Case, Fixtures, bad, ok
from trustlens import load_run, load_runs

A = "reading"


def _rows(path: Path) -> int:
    return load_run(path).tokens.collect().height


def cases(fx: Fixtures) -> list[Case]:
    v = fx.variants
    out: list[Case] = []
    for fn, arg in ((load_run, "path"), (load_runs, "folder")):
        for label, value, words in [
            ("None", None, (arg,)),
            ("empty", "", (arg,)),
            ("blank", "  ", (arg,)),
            ("a number", 3, (arg,)),
            ("bytes", b"/tmp", (arg,)),
            ("a list of paths", [str(fx.good)], (arg,)),
            ("a NUL in the path", "runs\x00x", (arg,)),
            ("missing", str(fx.root / "nope"), ("nope",)),
            ("a file", v["a_file"], ("a_file",)),
            ("a typo of the run", str(fx.good) + "_", ("good_",)),
        ]:
            out.append(bad(A, f"{fn.__name__} {label}", lambda fn=fn, value=value: fn(value), *words))
    out += [
        bad(A, "load_run a folder of runs", lambda: load_run(fx.runs), "runs", "seed1"),
        bad(A, "load_run a foreign folder", lambda: load_run(v["foreign"]), "foreign"),
        bad(A, "load_run an empty folder", lambda: load_run(v["empty"]), "empty"),
        bad(A, "load_run a newer schema", lambda: load_run(v["manifest_newer_schema"]), "schema"),
        bad(A, "load_run verify text", lambda: load_run(fx.good, verify="no"), "verify"),
        bad(A, "load_run tokens folder missing", lambda: load_run(v["tokens_missing"]).tokens.collect(), "token"),
        ok(A, "load_run the run", lambda: _rows(fx.good), lambda n: n == fx.rows),
        ok(A, "load_run its run.json", lambda: _rows(fx.good / "run.json"), lambda n: n == fx.rows),
        ok(A, "load_run a Path", lambda: _rows(Path(fx.good)), lambda n: n == fx.rows),
        ok(A, "load_runs a folder of runs", lambda: load_runs(fx.runs), lambda runs: len(runs) == 2),
        ok(A, "load_runs one run", lambda: load_runs(fx.good), lambda runs: len(runs) == 1),
        ok(A, "load_runs an empty folder", lambda: load_runs(v["empty"]), lambda runs: runs == []),
        ok(A, "load_runs a foreign folder", lambda: load_runs(v["foreign"]), lambda runs: runs == []),
        ok(
            A,
            "an empty filter",
            lambda: load_run(fx.good).tokens.filter(pl.col("step") > 999).collect(),
            lambda t: t.height == 0,
        ),
    ]
    # one part of another schema reads with what it has
    out += [
        ok(
            A,
            "a part with a column dropped",
            lambda: load_run(v["column_dropped"]).tokens.collect(),
            lambda t: t.height == fx.rows and t["pi_logp"].null_count() > 0,
        ),
        ok(
            A,
            "a part with a column added",
            lambda: load_run(v["column_added"]).tokens.collect(),
            lambda t: t.height == fx.rows and "extra" not in t.columns,
        ),
        ok(
            A,
            "a part with a column renamed",
            lambda: load_run(v["column_renamed"]).tokens.collect(),
            lambda t: t.height == fx.rows and "PI_LOGP" not in t.columns,
        ),
        ok(A, "a part without its step", lambda: _rows(v["key_dropped"]), lambda n: 0 < n < fx.rows, warns="part-"),
        ok(
            A,
            "a part with text for a number",
            lambda: _rows(v["text_for_number"]),
            lambda n: 0 < n < fx.rows,
            warns="part-",
        ),
        ok(A, "a truncated part", lambda: _rows(v["part_truncated"]), lambda n: 0 < n < fx.rows, warns="part-"),
        ok(A, "a part of 0 bytes", lambda: _rows(v["part_empty_file"]), lambda n: 0 < n < fx.rows, warns="part-"),
        ok(A, "a part holding CSV text", lambda: _rows(v["part_text"]), lambda n: 0 < n < fx.rows, warns="part-"),
        bad(A, "load_run a run without run.json", lambda: _rows(v["manifest_missing"]), "run.json"),
        ok(A, "run.json not JSON", lambda: _rows(v["manifest_garbage"]), lambda n: n == fx.rows, warns="run.json"),
        ok(A, "run.json a list", lambda: _rows(v["manifest_list"]), lambda n: n == fx.rows, warns="run.json"),
        ok(A, "run.json empty", lambda: _rows(v["manifest_empty"]), lambda n: n == fx.rows, warns="run.json"),
        ok(
            A,
            "run.json rules a string",
            lambda: _rows(v["manifest_rules_text"]),
            lambda n: n == fx.rows,
            warns="rules",
        ),
        ok(
            A,
            "run.json status unknown word",
            lambda: load_run(v["manifest_status_bogus"]).status,
            lambda s: isinstance(s, str),
        ),
        ok(
            A,
            "metrics folder missing",
            lambda: load_run(v["metrics_missing"]).metrics.collect(),
            lambda t: t.height == 0,
        ),
        ok(
            A,
            "samples folder missing",
            lambda: load_run(v["samples_missing"]).samples.collect(),
            lambda t: t.height == 0,
        ),
        ok(
            A,
            "load_runs with a corrupted run beside",
            lambda: load_runs(fx.root / "variants"),
            lambda runs: len(runs) >= 10,
        ),
    ]
    return out
