"""Checks of plain (non-tensor) arguments: numbers, integers, choices, names and paths.

Every check takes the argument's name and its value, returns the value in its canonical form
(an int, a float, a `Path`) and raises TypeError (wrong kind of object) or ValueError (right kind,
value outside its domain) with a message naming the argument, the value and what was expected:

    check_positive("merge_gap", -5)  ->  ValueError: merge_gap must be > 0, got -5

bool is not a number here (True is refused where a count or a threshold is expected), and an
integer argument refuses a float even when it is whole (1.0), so that a truncated value never
passes silently. The tensor checks are in trustlens.core.tensor_checks.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_number(
    name: str,
    value: object,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
    finite: bool = True,
) -> float:
    """A real number in the interval from `low` to `high` (closed ends unless `low_open` /
    `high_open`); NaN always refused, ±inf unless finite=False. Returns it as a float."""
    if not _is_real(value):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    x = float(value)  # type: ignore[arg-type]
    if math.isnan(x) or (finite and math.isinf(x)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if x < low or x > high or (low_open and x == low) or (high_open and x == high):
        if high == math.inf:
            expected = f"{'>' if low_open else '≥'} {low:g}"
        elif low == -math.inf:
            expected = f"{'<' if high_open else '≤'} {high:g}"
        else:
            expected = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be a number {expected}, got {value!r}")
    return x


def check_positive(name: str, value: object) -> float:
    """A finite number > 0 (a threshold, a factor, seconds, a temperature)."""
    x = check_number(name, value, finite=False)
    if not 0 < x < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return x


def check_temperature(value: object) -> float:
    """A sampling temperature τ: a finite number > 0. A ValueError for every bad value, a text or a
    bool included (as the divergences and the recorder have always raised)."""
    if _is_real(value) and 0 < float(value) < math.inf:  # type: ignore[arg-type]
        return float(value)  # type: ignore[arg-type]
    raise ValueError(f"temperature must be a finite number > 0, got {value!r}")


def check_nonnegative_number(name: str, value: object) -> float:
    """A finite number ≥ 0 (a noise level, a fraction that may be zero)."""
    x = check_number(name, value, finite=False)
    if not 0 <= x < math.inf:
        raise ValueError(f"{name} must be a finite number ≥ 0, got {value!r}")
    return x


def check_fraction(name: str, value: object, *, zero: bool = True, one: bool = True) -> float:
    """A number in [0, 1]; zero=False or one=False opens that end."""
    return check_number(name, value, low=0.0, high=1.0, low_open=not zero, high_open=not one)


def check_int(name: str, value: object, *, low: int | None = None, high: int | None = None) -> int:
    """An integer (a Python or numpy int, not a bool, not a float even when whole) in
    [low, high] (None: unbounded on that side). Returns it as an int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    n = int(value)
    if (low is not None and n < low) or (high is not None and n > high):
        expected = f"≥ {low}" if high is None else (f"≤ {high}" if low is None else f"in [{low}, {high}]")
        raise ValueError(f"{name} must be an integer {expected}, got {n}")
    return n


def check_optional_int(name: str, value: object, *, low: int | None = None, high: int | None = None) -> int | None:
    """None, or an integer as `check_int` requires."""
    return None if value is None else check_int(name, value, low=low, high=high)


def closest(value: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' naming the closest of `choices` to `value`, or '' when none is close."""
    match = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def check_choice(name: str, value: object, choices: Iterable[str]) -> str:
    """One of `choices` (strings); a typo names the closest choice."""
    options = list(choices)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {', '.join(options)}; got {type(value).__name__} {value!r}")
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(options)}; got {value!r}{closest(value, options)}")
    return value


def check_str(name: str, value: object, *, empty: bool = False) -> str:
    """A string; an empty one is refused unless empty=True."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__} {value!r}")
    if not value and not empty:
        raise ValueError(f"{name} must be a non-empty string, got ''")
    return value


def check_path(name: str, value: object) -> str | os.PathLike:
    """A path (a str or os.PathLike, an object-store URL included) that is not empty or blank,
    nor a URL scheme with no location after it ("s3://", "file://"): an empty path would silently
    mean the current directory (or a bucket's root). Returned unchanged."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {type(value).__name__} {value!r}")
    text = os.fspath(value)
    if isinstance(text, bytes):
        raise TypeError(f"{name} must be a text path, got bytes {text!r}")
    if not text.strip():
        raise ValueError(f"{name} must be a non-empty path, got {text!r} (use '.' for the current directory)")
    scheme, sep, rest = text.partition("://")
    if sep and scheme.isidentifier() and not rest.strip("/ "):  # "s3://", "file://": a scheme and no place
        raise ValueError(f"{name} must name a location after {scheme}://, got {text!r}")
    if "\x00" in text:
        raise ValueError(f"{name} holds a NUL character: {text!r}")
    return value


def check_existing_dir(name: str, value: object) -> Path:
    """A local directory that exists, as a Path."""
    path = Path(check_path(name, value))
    if not path.is_dir():
        raise ValueError(f"{name} {str(path)!r} is not a directory" + ("" if path.exists() else " (it does not exist)"))
    return path


def check_bool(name: str, value: object) -> bool:
    """True or False (a numpy bool too); a string such as "no" is refused, not read as true."""
    if type(value).__name__ not in ("bool", "bool_"):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r:.80}")
    return bool(value)


def check_type(name: str, value: object, kinds: type | tuple[type, ...], expected: str) -> object:
    """`value` when it is an instance of `kinds`; else a TypeError naming the argument,
    `expected` (e.g. "a polars DataFrame") and what was given."""
    if not isinstance(value, kinds):
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r:.80}")
    return value


def _pair(name: str, value: object, what: str) -> tuple[object, object]:
    """`value` as a pair (a tuple or list of two), else a TypeError naming `what` it should be."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name} must be {what}, got {type(value).__name__} {value!r:.80}")
    return value[0], value[1]


def check_attributes(name: str, value: object, attributes: Iterable[str], expected: str) -> object:
    """`value` when it is an object (not a mapping) with every one of `attributes`; else a
    TypeError naming the argument, `expected` (e.g. "a vLLM SamplingParams") and what was given.
    For the config objects of other libraries, read by attribute without importing them."""
    missing = [a for a in attributes if not hasattr(value, a)]
    if isinstance(value, Mapping) or missing:
        lacks = f" (it has no {', '.join(missing)})" if missing and value is not None else ""
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r:.80}{lacks}")
    return value


def check_step_range(name: str, value: object) -> tuple[int, int]:
    """A (first, last) pair of steps: integers with 0 ≤ first ≤ last."""
    first, last = _pair(name, value, "a (first, last) pair of steps")
    lo, hi = check_int(f"{name}[0]", first, low=0), check_int(f"{name}[1]", last, low=0)
    if lo > hi:
        raise ValueError(f"{name} must be a (first, last) pair with first ≤ last, got {(lo, hi)!r}")
    return lo, hi


def check_step_values(name: str, value: object) -> list[tuple[int, float]]:
    """A series as (step, value) pairs: steps integers ≥ 0, values finite numbers (a step without
    a known value is left out of the series, not given as NaN or None)."""
    items = check_sequence(name, value, what="a list of (step, value) pairs")
    out = []
    for i, item in enumerate(items):
        step, x = _pair(f"{name}[{i}]", item, "a (step, value) pair")
        out.append((check_int(f"{name}[{i}] step", step, low=0), check_number(f"{name}[{i}] value", x)))
    return out


def check_interval(name: str, value: object) -> tuple[float, float]:
    """A (lo, hi) pair of finite numbers with lo < hi (a plot range)."""
    first, last = _pair(name, value, "a (lo, hi) pair of numbers")
    lo, hi = check_number(f"{name}[0]", first), check_number(f"{name}[1]", last)
    if not lo < hi:
        raise ValueError(f"{name} must be a (lo, hi) pair with lo < hi, got {(lo, hi)!r}")
    return lo, hi


def check_sequence(name: str, value: object, *, empty: bool = True, what: str = "a list") -> list:
    """The items of a list, tuple or other iterable (a numpy array, a range) as a list; a string,
    bytes or a mapping is refused (each would be read item by item), and an empty one unless
    empty=True. `what` names what the list holds in the error ("a list of numbers")."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__} {value!r:.80}")
    items = list(value)
    if not items and not empty:
        raise ValueError(f"{name} must be {what} with at least one item, got an empty {type(value).__name__}")
    return items


def check_numbers(name: str, value: object, *, empty: bool = False, **bounds: Any) -> list[float]:
    """A list of numbers, each as `check_number(**bounds)` requires (errors name `name[i]`);
    an empty list is refused unless empty=True."""
    items = check_sequence(name, value, empty=empty, what="a list of numbers")
    return [check_number(f"{name}[{i}]", v, **bounds) for i, v in enumerate(items)]


def check_names(name: str, value: object, choices: Iterable[str] | None = None, *, empty: bool = True) -> list[str]:
    """A list of non-empty strings (a single string is refused: give [name]), each one of
    `choices` when given (a typo names the closest); no name twice."""
    items = check_sequence(name, value, empty=empty, what="a list of names")
    options = None if choices is None else list(choices)
    names = [
        check_str(f"{name}[{i}]", v) if options is None else check_choice(f"{name}[{i}]", v, options)
        for i, v in enumerate(items)
    ]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{name} lists {', '.join(map(repr, twice))} more than once")
    return names


def check_columns(name: str, columns: Iterable[str], required: Iterable[str]) -> None:
    """Require every name of `required` among `columns` (a table's), naming the missing ones and
    the closest column to each."""
    have = list(columns)
    missing = [c for c in required if c not in have]
    if missing:
        hints = "".join(closest(c, have) for c in missing)
        raise ValueError(f"{name} lacks the column(s) {', '.join(missing)}{hints}; it has {', '.join(have) or 'none'}")


def check_keys(name: str, value: object, allowed: Iterable[str]) -> Mapping:
    """A mapping whose keys are all among `allowed` (a typo names the closest); returned unchanged."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping, got {type(value).__name__} {value!r:.80}")
    options = list(allowed)
    unknown = [k for k in value if k not in options]
    if unknown:
        first = unknown[0]
        hint = closest(first, options) if isinstance(first, str) else ""
        raise ValueError(f"{name} has the unknown key {first!r}{hint}; known keys: {', '.join(options)}")
    return value


# Where a mirror streams each step's scalars: "tensorboard:LOGDIR", "wandb" or "wandb:PROJECT".
MIRROR_SPECS = "'tensorboard:LOGDIR', 'wandb' or 'wandb:PROJECT'"


def check_mirror(name: str, value: object) -> tuple[str, str]:
    """(kind, target) of a mirror destination string: ("tensorboard", LOGDIR) with a non-empty
    LOGDIR, or ("wandb", PROJECT) with PROJECT possibly empty (W&B's default project). Checked
    without importing TensorBoard or W&B, so that a typo fails before any work."""
    text = check_str(name, value)
    kind, _, target = text.partition(":")
    if kind == "wandb" or (kind == "tensorboard" and target.strip()):
        return kind, target
    hint = "" if kind == "tensorboard" else closest(kind, ["tensorboard", "wandb"])
    raise ValueError(f"{name} must be {MIRROR_SPECS}, got {text!r}{hint}")


def _flag(flag: str, check: Callable[[str, object], Any], text: str) -> Any:
    """`check(flag, text)` of a flag's raw text, its error as argparse's one-line usage error
    (raised while the flags are parsed, before any work; argparse names the flag itself)."""
    import argparse

    try:
        return check(flag, text)
    except (TypeError, ValueError) as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix(f"{flag} ")) from err


# the severities a run can stop on (`trustlens train --stop-on`, the TRL hook's stop_on)
STOP_ON = ("critical", "warning", "never")
# the exit code of `trustlens train` that --stop-on stopped (run.json status `stopped`), and of
# `trustlens watch` on such a run
EXIT_ALERT_STOP = 4


def check_stop_on(name: str, value: object) -> str:
    """One of STOP_ON."""
    return check_choice(name, value, STOP_ON)


def choice_arg(options: Callable[[], Iterable[str]]) -> Callable[[str], str]:
    """argparse type of a flag whose value is one of `options()`: a typo is answered with the
    closest choice while the flags are parsed. `options` is called only when the flag is given, so
    the module that knows the choices (one importing torch, say) stays out of `--help`."""

    def parse(text: str) -> str:
        return _flag("value", lambda name, value: check_choice(name, value, options()), text)

    return parse


def mirror_arg(text: str) -> str:
    """argparse type of a --mirror flag: a destination `check_mirror` accepts."""
    _flag("--mirror", check_mirror, text)
    return text


def path_arg(text: str) -> Path:
    """argparse type of a path flag: `check_path` on the raw text, before pathlib reads "" as
    "." (the current directory)."""
    return Path(_flag("path", check_path, text))


def text_arg(text: str) -> str:
    """argparse type of a flag whose value must not be empty (a host name)."""
    return _flag("value", check_str, text)


def check_port(name: str, value: object) -> int:
    """A TCP port: an integer in [1, 65535]."""
    return check_int(name, value, low=1, high=65535)


def port_arg(text: str) -> int:
    """argparse type of a --port flag: `check_port` on the integer the text spells, its error as
    argparse's one-line usage error (raised while the flags are parsed, before any work)."""
    import argparse

    try:
        return check_port("--port", int(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected a TCP port, an integer in [1, 65535], got {text!r}") from err
