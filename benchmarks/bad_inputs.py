"""Is any bad input silent or confusing? A catalogue of plausible mistakes a careless user makes,
each run once and classified automatically.

    python benchmarks/bad_inputs.py [--area AREA ...] [--timeout SECONDS] [--all]

Areas: math (the divergences, the rules, policy_loss), recorder (TokenRecorder's construction,
record, log_samples, log_metrics, resume), reading (load_run / load_runs on corrupted, partial
and foreign folders), analyses (every function of trustlens.analysis), config (CollapseConfig,
TrainConfig, Keep, Rule), export/report, cli (`trustlens train/demo/dashboard/export/report/
doctor/claims/compare` in-process through trustlens.cli.main), engines (the engine adapters'
sampling and EngineTokens, TokenRecorder sampling/model_kind, `train --engine`, `doctor`). The cases live in
benchmarks/bad_input_cases/. Each case is

- clear: refused with ValueError, TypeError, KeyError, an OSError about a file or a trustlens
  error class, whose message holds the words the case names (the argument at least); for the
  CLI: exit status 2, the words on stderr, no traceback;
- valid: a valid input accepted with the right result (each valid case checks its result);
- silent: a bad input accepted (for the CLI: exit 0, or a training run or a server it would
  start — the benchmark stops those before they start), or a valid input's result wrong;
- confusing: an error that does not name what the user passed (from inside polars, torch or
  numpy, AttributeError, IndexError, ...), or a valid input refused;
- hang: still running after --timeout seconds.

It prints the counts per area and overall, then each case that is not clear or valid (--all:
every case). Runs in about a minute on a 2-core CPU machine.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import signal
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bad_input_cases import Case, fixtures

AREAS = {
    "math": "math_cases",
    "recorder": "recorder_cases",
    "reading": "reading_cases",
    "analyses": "analysis_cases",
    "config": "config_cases",
    "export/report": "export_cases",
    "cli": "cli_cases",
    "engines": "engine_cases",
}
KINDS = ("clear", "valid", "silent", "confusing", "hang")
# error classes that answer a user clearly when their message names the argument
CLEAR_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
)
# libraries whose own errors never name what the user passed
DEEP_MODULES = ("polars", "torch", "numpy", "pyarrow", "pandas", "streamlit")


class Hang(BaseException):
    """Raised in the case by the timer: a BaseException, so no `except Exception` swallows it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise Hang


def message(err: BaseException) -> str:
    return str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)


def is_clear(err: BaseException, words: tuple[str, ...]) -> bool:
    module = type(err).__module__.split(".")[0]
    if module in DEEP_MODULES or not (isinstance(err, CLEAR_ERRORS) or module == "trustlens"):
        return False
    text = message(err).lower()
    return all(w.lower() in text for w in words)


def classify(case: Case, timeout: float) -> tuple[str, str]:
    """(kind, what happened) of one case."""
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = case.call()
    except Hang:
        return "hang", f"still running after {timeout:g} s"
    except BaseException as err:
        what = f"{type(err).__module__}.{type(err).__name__}: {message(err)[:300]}"
        if case.valid:
            return "confusing", f"a valid input refused: {what}"
        return ("clear" if is_clear(err, case.words) else "confusing"), what
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    warned = " | ".join(str(w.message)[:200] for w in caught)
    if not case.valid:
        return "silent", f"accepted{f' (warned: {warned})' if warned else ''}"
    try:
        right = bool(case.check(result))  # type: ignore[misc]
    except Exception as err:
        return "silent", f"accepted, its result unreadable: {type(err).__name__}: {err}"
    if not right:
        return "silent", f"accepted with a wrong result: {str(result)[:200]}"
    if case.warns and case.warns.lower() not in warned.lower():
        return "silent", f"accepted without a warning naming {case.warns!r} (warned: {warned or 'nothing'})"
    return "valid", ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--area", action="append", choices=list(AREAS), help="only these areas (repeatable)")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds a case may run before it counts as a hang")
    parser.add_argument("--all", action="store_true", help="list every case, not only the non-clear ones")
    args = parser.parse_args(argv)
    areas = args.area or list(AREAS)
    start = time.perf_counter()
    counts: dict[str, Counter] = {}
    listed: list[tuple[str, str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="bad_inputs") as tmp:
        fx = fixtures(Path(tmp))
        for area in areas:
            module = importlib.import_module(f"bad_input_cases.{AREAS[area]}")
            counts[area] = Counter()
            for case in module.cases(fx):
                with contextlib.redirect_stdout(io.StringIO()):
                    kind, what = classify(case, args.timeout)
                counts[area][kind] += 1
                if args.all or kind not in ("clear", "valid"):
                    listed.append((area, kind, case.label, what))
    total: Counter = sum(counts.values(), Counter())
    width = max(len(a) for a in [*areas, "overall"])
    print(f"{'area':<{width}}  " + "  ".join(f"{k:>9}" for k in KINDS) + "      all")
    for area, row in [*counts.items(), ("overall", total)]:
        print(f"{area:<{width}}  " + "  ".join(f"{row[k]:>9}" for k in KINDS) + f"  {sum(row.values()):>7}")
    print(f"({time.perf_counter() - start:.0f} s)")
    if listed:
        print()
        for area, kind, label, what in listed:
            print(f"[{kind}] {area}: {label}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
