"""`doctor(run)`: find the log-probability bugs that fake a training–inference mismatch.

Each check (docs/doctor.md) reads the run's token rows lazily and returns a `Finding`:

    shift         log μ and log π_old shifted by one position (1c)
    token_ids     the trainer scores other token ids than the engine sampled (1e)
    sentinel      log μ written as 0, a large negative constant or nothing (1d)
    temperature   μ not at the sampling temperature (raw log-probs) (1a)
    truncation    μ renormalised over a truncated support (top-p, top-k, min-p) (1b)
    engine_drift  the mismatch grows while the policy does not change (1h)
    where         where the mismatch sits: first tokens, position, entropy, μ decade (1f)
    level         the mismatch against the published ranges for dense and MoE models (1g)
    routing       how much of a mixture-of-experts run's mismatch its routing flips carry (issue 49)

`doctor` lists them most severe first (`finding.ordered`); `trustlens doctor RUN` prints them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

from trustlens.analysis.diagnosis.alignment import sentinel_check, shift_check, token_ids_check
from trustlens.analysis.diagnosis.finding import CHECKS, VERDICTS, Finding, note_consequences, ordered
from trustlens.analysis.diagnosis.inputs import Inputs, Sampling, inputs_of, read_sampling
from trustlens.analysis.diagnosis.level import engine_drift_check, level_check, per_step_mismatch, where_check
from trustlens.analysis.diagnosis.routing import routing_check
from trustlens.analysis.diagnosis.sampling import temperature_check, truncation_check
from trustlens.analysis.inputs import lazy_rows
from trustlens.core.values import check_names


def doctor(run: Any, checks: Sequence[str] | None = None) -> list[Finding]:
    """Every check's finding on `run` (a Run, a run path, or a token LazyFrame), most severe
    first; only those of `checks` (names of CHECKS) when given. A run without μ gets one ok
    finding per check saying so."""
    if isinstance(run, str | os.PathLike):
        from trustlens.run import load_run

        run = load_run(run)
    lazy_rows("doctor", run, "run")  # a Run or its token rows; anything else is a TypeError naming it
    wanted = CHECKS if checks is None else check_names("checks", checks, CHECKS)
    inp = inputs_of(run)
    if not inp.has_mu:
        return [Finding(c, "ok", "no μ recorded: nothing to compare with π_old") for c in wanted]
    per_step = functools.cache(lambda: per_step_mismatch(inp))  # read by engine_drift and level, once
    run_check: dict[str, Callable[[], Finding]] = {
        "shift": lambda: shift_check(inp),
        "token_ids": lambda: token_ids_check(inp),
        "sentinel": lambda: sentinel_check(inp),
        "temperature": lambda: temperature_check(inp),
        "truncation": lambda: truncation_check(inp),
        "engine_drift": lambda: engine_drift_check(inp, per_step()),
        "where": lambda: where_check(inp),
        "level": lambda: level_check(inp, per_step()),
        "routing": lambda: routing_check(inp),
    }
    return note_consequences(ordered([run_check[c]() for c in CHECKS if c in wanted]))


__all__ = [
    "CHECKS",
    "VERDICTS",
    "Finding",
    "Inputs",
    "Sampling",
    "doctor",
    "inputs_of",
    "note_consequences",
    "ordered",
    "read_sampling",
]
