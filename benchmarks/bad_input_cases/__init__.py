"""The cases of benchmarks/bad_inputs.py: what a careless user passes, and what the answer must be.

A `Case` is one call. A bad input expects a *clear* refusal: ValueError, TypeError, KeyError, an
OSError about a file, or one of trustlens' own error classes, whose message holds every word of
`words` (case-insensitive; at least the argument's name). A valid input expects the call to
succeed and `check(result)` to be true. Each area module (math_cases, recorder_cases, ...) has
`cases(fx)` building its list from the shared fixtures `fx` (a small run and its corrupted
copies, made once in a temporary folder by `fixtures`).
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAN, INF = math.nan, math.inf


@dataclass
class Case:
    area: str  # math, recorder, reading, analyses, config, export/report, cli
    label: str  # what was passed, as the user would describe it
    call: Callable[[], Any]  # the call; its result goes to `check`
    words: tuple[str, ...] = ()  # bad input: words its error must hold (empty: a valid input)
    check: Callable[[Any], bool] | None = None  # valid input: is the result right?
    warns: str | None = None  # valid input: a word one of its warnings must hold

    @property
    def valid(self) -> bool:
        return self.check is not None


def bad(area: str, label: str, call: Callable[[], Any], *words: str) -> Case:
    """A bad input: refused with an error naming `words`."""
    if not words:
        raise ValueError(f"bad case {label!r} names no word its error must hold")
    return Case(area, label, call, tuple(words))


def ok(area: str, label: str, call: Callable[[], Any], check: Callable[[Any], bool], warns: str | None = None) -> Case:
    """A valid input: accepted, `check(result)` true (and a warning holding `warns`, if given)."""
    return Case(area, label, call, check=check, warns=warns)


@dataclass
class Fixtures:
    root: Path  # the temporary folder everything lives in
    good: Path  # a small finished synthetic run
    rows: int  # its token rows
    runs: Path  # a folder holding two runs
    variants: dict[str, Path] = field(default_factory=dict)  # corrupted copies of `good`
    counter: list[int] = field(default_factory=lambda: [0])

    def fresh(self, name: str = "rec") -> Path:
        """A path that does not exist yet (for a recorder or an output)."""
        self.counter[0] += 1
        return self.root / "fresh" / f"{name}{self.counter[0]}"


def _token_parts(run: Path) -> list[Path]:
    return sorted((run / "tokens").rglob("*.parquet"))


def _variant(fx: Fixtures, name: str, mutate: Callable[[Path], None]) -> None:
    path = fx.root / "variants" / name
    shutil.copytree(fx.good, path)
    mutate(path)
    fx.variants[name] = path


def _rewrite_first_part(path: Path, change: Callable[[Any], Any]) -> None:
    import pyarrow.parquet as pq

    part = _token_parts(path)[0]
    pq.write_table(change(pq.read_table(part)), part)


def fixtures(root: Path) -> Fixtures:
    """A small run (6 steps of 8 samples of ≤ 8 tokens), a folder of two runs, and copies of the
    run each with one thing wrong (a part, run.json or a folder)."""
    import pyarrow as pa

    from trustlens.run import load_run
    from trustlens.synthetic import write_synthetic_run

    small = dict(steps=6, samples_per_step=8, seq_len=8, group_size=4, rows_per_part=60)
    good = Path(write_synthetic_run(root / "good", **small))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = load_run(good).tokens.collect().height
    runs = root / "runs"
    for seed in (1, 2):
        write_synthetic_run(runs / f"seed{seed}", seed=seed, **small)
    fx = Fixtures(root, good, rows, runs)

    _variant(fx, "column_dropped", lambda p: _rewrite_first_part(p, lambda t: t.drop(["pi_logp"])))
    _variant(
        fx,
        "column_added",
        lambda p: _rewrite_first_part(p, lambda t: t.append_column("extra", pa.array([1.0] * t.num_rows))),
    )
    _variant(
        fx,
        "column_renamed",
        lambda p: _rewrite_first_part(
            p, lambda t: t.rename_columns([("PI_LOGP" if c == "pi_logp" else c) for c in t.column_names])
        ),
    )
    _variant(fx, "key_dropped", lambda p: _rewrite_first_part(p, lambda t: t.drop(["step"])))
    _variant(
        fx,
        "text_for_number",
        lambda p: _rewrite_first_part(
            p, lambda t: t.set_column(t.column_names.index("pi_logp"), "pi_logp", pa.array(["x"] * t.num_rows))
        ),
    )
    _variant(fx, "part_truncated", lambda p: _token_parts(p)[0].write_bytes(_token_parts(p)[0].read_bytes()[:200]))
    _variant(fx, "part_empty_file", lambda p: _token_parts(p)[0].write_bytes(b""))
    _variant(fx, "part_text", lambda p: _token_parts(p)[0].write_text("step,pi_logp\n0,-1\n"))
    _variant(fx, "manifest_missing", lambda p: (p / "run.json").unlink())
    _variant(fx, "manifest_garbage", lambda p: (p / "run.json").write_text("{not json"))
    _variant(fx, "manifest_list", lambda p: (p / "run.json").write_text("[1, 2]"))
    _variant(fx, "manifest_empty", lambda p: (p / "run.json").write_text(""))
    _variant(fx, "manifest_newer_schema", lambda p: _edit_manifest(p, schema_version=999))
    _variant(fx, "manifest_rules_text", lambda p: _edit_manifest(p, rules="ppo"))
    _variant(fx, "manifest_status_bogus", lambda p: _edit_manifest(p, status="exploded"))
    _variant(fx, "tokens_missing", lambda p: shutil.rmtree(p / "tokens"))
    _variant(fx, "metrics_missing", lambda p: shutil.rmtree(p / "metrics"))
    _variant(fx, "samples_missing", lambda p: shutil.rmtree(p / "samples", ignore_errors=True))
    foreign = root / "foreign"
    foreign.mkdir()
    (foreign / "data.csv").write_text("a,b\n1,2\n")
    fx.variants["foreign"] = foreign
    empty = root / "empty"
    empty.mkdir()
    fx.variants["empty"] = empty
    a_file = root / "a_file.txt"
    a_file.write_text("not a run")
    fx.variants["a_file"] = a_file
    return fx


def _edit_manifest(path: Path, **changes: Any) -> None:
    manifest = json.loads((path / "run.json").read_text())
    manifest.update(changes)
    (path / "run.json").write_text(json.dumps(manifest))
