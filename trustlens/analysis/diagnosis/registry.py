"""The doctor's checks: one registry, filled where each check is defined.

A check is one function of `Inputs` returning its `Finding`, decorated where it lives:

    @check("shift", kind="cause", cadence="early", order=10)
    def shift_check(inp: Inputs) -> Finding: ...

kind     "cause": the check names a root cause (a bug in how log μ or log π_old was made).
         Causes are listed before symptoms, in `order`: the order in which one raises the next
         (a shifted μ reads as a sentinel and as truncation, so shift comes first), and every
         later finding that is not ok "may follow from" the first cause found a problem.
         "symptom": the check describes the mismatch, which a cause raises too; symptoms are
         listed by how far their statistic is past its problem threshold (`order` breaks ties).
cadence  "early": the live doctor decides it from the run's first steps (trustlens.live.doctor);
         "every": it accumulates over the run, run every few steps and at the run's end.

`doctor()` (trustlens.analysis.diagnosis) and the live doctor iterate `registered()`; nothing
else lists the checks (tests/test_layout.py holds that). The check modules are imported by the
package's `__init__`, so importing any part of trustlens.analysis.diagnosis fills the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KINDS = ("cause", "symptom")
CADENCES = ("early", "every")


@dataclass(frozen=True)
class Check:
    """One registered check (module docstring)."""

    name: str  # the finding's `check`, the name users pass to doctor(checks=...) and see in the output
    kind: str  # "cause" or "symptom"
    cadence: str  # "early" (decided from the first steps) or "every" (accumulating)
    order: int  # place among the checks of its kind (causes: the order one raises the next)
    run: Callable[[Any], Any]  # the check itself: Inputs -> Finding (neither imported here: no cycle)


_CHECKS: dict[str, Check] = {}


def check(name: str, *, kind: str, cadence: str, order: int) -> Callable[[Callable], Callable]:
    """Register the decorated function as the doctor check `name` (module docstring); the
    function is returned unchanged."""
    if kind not in KINDS:
        raise ValueError(f"check {name!r}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if cadence not in CADENCES:
        raise ValueError(f"check {name!r}: cadence must be one of {', '.join(CADENCES)}, got {cadence!r}")

    def register(fn: Callable) -> Callable:
        if name in _CHECKS and _CHECKS[name].run is not fn:
            raise ValueError(f"doctor check {name!r} is registered already (by {_CHECKS[name].run.__qualname__})")
        _CHECKS[name] = Check(name, kind, cadence, order, fn)
        return fn

    return register


def registered() -> tuple[Check, ...]:
    """Every check: the causes in their order, then the symptoms in theirs."""
    return tuple(sorted(_CHECKS.values(), key=lambda c: (KINDS.index(c.kind), c.order, c.name)))


def names(*, kind: str | None = None, cadence: str | None = None) -> tuple[str, ...]:
    """The names of the registered checks (of `kind` / `cadence` when given), in `registered()`
    order."""
    return tuple(
        c.name for c in registered() if (kind is None or c.kind == kind) and (cadence is None or c.cadence == cadence)
    )


def get(name: str) -> Check:
    """The check `name`; ValueError naming every registered check otherwise."""
    if name not in _CHECKS:
        raise ValueError(f"doctor check must be one of {', '.join(names())}, got {name!r}")
    return _CHECKS[name]


__all__ = ["CADENCES", "KINDS", "Check", "check", "get", "names", "registered"]
