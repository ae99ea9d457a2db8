"""`doctor(run)`: find the log-probability bugs that fake a training–inference mismatch.

Each check (docs/doctor.md) is one function of `Inputs` (the run's token rows, read lazily, and
run.json), registered where it is defined with `@check(name, kind=, cadence=, order=)`
(trustlens.analysis.diagnosis.registry); `doctor` runs the registered checks and lists their
findings most severe first (`finding.ordered`); `trustlens doctor RUN` prints them. The modules:

    alignment  log μ and log π_old describe the same token at the same place (shift, sentinel, ids)
    sampling   μ's sampling temperature
    support    a truncated sampling support (top-p, top-k, min-p) and its bias of the ratio
    sequence_weight  a recorded sequence weight made with the sum of the log-ratios
    engine_weights   the engine serving other weights than the trainer's (frozen policy, resume)
    level      the mismatch itself (where it sits, its level, its growth without training)
    exact      log μ = log π_old bit for bit, or nearly (`trustlens certify`)
    routing    how much of a mixture-of-experts run's mismatch its routing flips carry

A new check is one decorated function in one of them (or in a new module imported below).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from trustlens.analysis.diagnosis import (  # noqa: F401  (they register their checks)
    alignment,
    engine_weights,
    exact,
    level,
    routing,
    sampling,
    sequence_weight,
    support,
)
from trustlens.analysis.diagnosis.finding import VERDICTS, Finding, note_consequences, ordered
from trustlens.analysis.diagnosis.finding import (
    __getattr__ as __getattr__,
)  # CHECKS, CAUSES, SYMPTOMS: the registry's views
from trustlens.analysis.diagnosis.inputs import Inputs, Sampling, inputs_of, read_sampling
from trustlens.analysis.diagnosis.registry import Check, check, names, registered
from trustlens.analysis.sources import lazy_rows
from trustlens.core.argument_checks import check_names


def doctor(run: Any, checks: Sequence[str] | None = None) -> list[Finding]:
    """Every check's finding on `run` (a Run, a run path, or a token LazyFrame), most severe
    first; only those of `checks` (names of registered checks) when given. A run without μ gets
    one ok finding per check saying so."""
    if isinstance(run, str | os.PathLike):
        from trustlens.run import load_run

        run = load_run(run)
    lazy_rows("doctor", run, "run")  # a Run or its token rows; anything else is a TypeError naming it
    every = names()
    wanted = every if checks is None else check_names("checks", checks, every)
    inp = inputs_of(run)
    if not inp.has_mu:
        return [Finding(c, "ok", "no μ recorded: nothing to compare with π_old") for c in wanted]
    return note_consequences(ordered([c.run(inp) for c in registered() if c.name in wanted]))


__all__ = [
    "CAUSES",
    "CHECKS",
    "SYMPTOMS",
    "VERDICTS",
    "Check",
    "Finding",
    "Inputs",
    "Sampling",
    "check",
    "doctor",
    "inputs_of",
    "note_consequences",
    "ordered",
    "read_sampling",
    "registered",
]
