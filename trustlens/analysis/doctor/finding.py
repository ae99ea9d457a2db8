"""A doctor finding and the order findings are listed in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VERDICTS = ("ok", "warning", "problem")  # in increasing severity
# the checks: first those that name a root cause (a bug in how log μ or log π_old was made),
# then those that describe the mismatch (which a root cause raises too)
CAUSES = ("sentinel", "token_ids", "shift", "temperature", "truncation")
SYMPTOMS = ("engine_drift", "where", "level")
CHECKS = CAUSES + SYMPTOMS


@dataclass(frozen=True)
class Finding:
    """One check's result on a run."""

    check: str  # one of CHECKS
    verdict: str  # "ok", "warning" or "problem"
    summary: str  # one line: what the data show
    evidence: dict[str, Any] = field(default_factory=dict)  # the statistic, its threshold, steps, example tokens
    fix: str = ""  # one line: the likely fix ("" when there is nothing to fix)
    strength: float = 0.0  # the statistic over its problem threshold (≥ 1 at a problem): orders findings of one verdict

    def __post_init__(self) -> None:
        if self.check not in CHECKS:
            raise ValueError(f"check must be one of {', '.join(CHECKS)}, got {self.check!r}")
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, got {self.verdict!r}")

    def to_json(self) -> dict[str, Any]:
        """{check, verdict, summary, evidence, fix}: the `trustlens doctor --json` entry."""
        return {
            "check": self.check,
            "verdict": self.verdict,
            "summary": self.summary,
            "evidence": self.evidence,
            "fix": self.fix,
        }


def ordered(findings: list[Finding]) -> list[Finding]:
    """Most severe first: by verdict (problem, warning, ok), then root causes before symptoms
    (a planted bug also raises the level of the mismatch), then by strength (largest first),
    then in CHECKS order."""
    return sorted(
        findings,
        key=lambda f: (
            -VERDICTS.index(f.verdict),
            f.check in SYMPTOMS,
            -min(f.strength, 1e6),
            CHECKS.index(f.check),
        ),
    )


def verdict_of(value: float | None, warning: float, problem: float) -> str:
    """ "problem" when value ≥ problem, "warning" when ≥ warning, else "ok" (None: ok)."""
    if value is None:
        return "ok"
    return "problem" if value >= problem else ("warning" if value >= warning else "ok")


__all__ = ["CAUSES", "CHECKS", "SYMPTOMS", "VERDICTS", "Finding", "ordered", "verdict_of"]
