"""The doctor's checks (trustlens.analysis.diagnosis) on a run being written.

The checks registered with cadence "early" (trustlens.analysis.diagnosis.registry: the root
causes read from a run's start) decide from the first steps: they run at each of the first
`early_steps` steps on the token rows of the steps so far, and not after. Those with cadence
"every" accumulate: they run every `every` steps on the rows held, those of the first
`early_steps` steps and of the last `recent_steps` steps (so engine_drift compares the run's
start with its recent steps), a bounded set however long the run, and once more when the run
ends; a finding of theirs says it may follow from a cause found a problem (`note_consequences`). Each finding is
raised once, at the first step its verdict is warning or problem, and again only if it turns
from warning to problem.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from trustlens.analysis.diagnosis import doctor
from trustlens.analysis.diagnosis.finding import VERDICTS, Finding, note_consequences, ordered
from trustlens.analysis.diagnosis.registry import names
from trustlens.core.argument_checks import check_int
from trustlens.live.rows import MemoryRun


@dataclass(frozen=True)
class DoctorConfig:
    """When the live doctor runs its checks (module docstring)."""

    early_steps: int = 5  # steps the root-cause checks decide from (and whose rows are kept)
    recent_steps: int = 10  # latest steps whose rows the accumulating checks also read
    every: int = 25  # the accumulating checks run every this many steps

    def __post_init__(self) -> None:
        for name in ("early_steps", "recent_steps", "every"):
            check_int(name, getattr(self, name), low=1)


class LiveDoctor:
    """The doctor's findings, step by step; `push` gives those whose verdict first turned warning
    or problem at the step."""

    def __init__(self, manifest: Mapping[str, Any], config: DoctorConfig) -> None:
        self.manifest, self.config = dict(manifest), config
        self.early: list[pl.DataFrame] = []  # token rows of the first early_steps steps
        self.recent: deque[pl.DataFrame] = deque(maxlen=config.recent_steps)
        self.steps = 0
        self.raised: dict[str, str] = {}  # check -> the verdict raised
        self.causes: list[Finding] = []  # the early checks' findings at the last early step

    def push(self, tokens: pl.DataFrame) -> list[Finding]:
        """Judge after a step whose token rows are `tokens`."""
        self.steps += 1
        if tokens.height == 0:
            return []
        if len(self.early) < self.config.early_steps:
            self.early.append(tokens)
        else:
            self.recent.append(tokens)
        early = self.steps <= self.config.early_steps
        accumulate = self.steps % self.config.every == 0
        if not early and not accumulate:
            return []
        return self._judge(early=early, accumulate=accumulate)

    def finish(self) -> list[Finding]:
        """The run ended: the accumulating checks judge the rows held once more, when steps came
        since they last ran (a run shorter than `every` steps, or its last steps)."""
        if not self.early or self.steps % self.config.every == 0:
            return []
        return self._judge(early=False, accumulate=True)

    def _judge(self, *, early: bool, accumulate: bool) -> list[Finding]:
        frames = [*self.early, *self.recent]
        run = MemoryRun.of(self.manifest, {"tokens": pl.concat(frames, how="diagonal_relaxed")}, name="live doctor")
        decided_early = names(cadence="early")
        checks = (decided_early if early else ()) + (names(cadence="every") if accumulate else ())
        found = doctor(run, checks)
        if early:
            self.causes = [f for f in found if f.check in decided_early]
        else:
            found = note_consequences(ordered([*self.causes, *found]))
        new = []
        for f in found:
            if f.verdict == "ok" or f.check not in checks:
                continue
            before = self.raised.get(f.check)
            if before is None or VERDICTS.index(f.verdict) > VERDICTS.index(before):
                self.raised[f.check] = f.verdict
                new.append(f)
        return new


__all__ = ["DoctorConfig", "LiveDoctor"]
