"""A doctor finding and the order findings are listed in."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

VERDICTS = ("ok", "warning", "problem")  # in increasing severity
# the checks: first those that name a root cause (a bug in how log μ or log π_old was made), in
# the order one can raise the next — a shifted μ pairs each token with its neighbour's log-prob
# (a near-certain neighbour's log μ = 0 reads as a sentinel, and μ > π_old as truncation), a
# wrong token id gives π_old ≈ 0 — then those that describe the mismatch, which a cause raises too
CAUSES = ("shift", "token_ids", "sentinel", "temperature", "truncation")
SYMPTOMS = ("engine_drift", "where", "level", "routing")
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
    """Most severe first: by verdict (problem, warning, ok), then the root causes in CAUSES
    order (a cause can raise the checks after it), then the symptoms by strength (largest
    first)."""
    return sorted(
        findings,
        key=lambda f: (
            -VERDICTS.index(f.verdict),
            f.check in SYMPTOMS,
            CHECKS.index(f.check) if f.check in CAUSES else 0,
            -min(f.strength, 1e6),
            CHECKS.index(f.check),
        ),
    )


def note_consequences(findings: list[Finding]) -> list[Finding]:
    """`findings` (ordered) with every later non-ok finding after the first cause found a
    problem marked as possibly following from it (summary suffix, evidence "may_follow_from")."""
    first = next((f for f in findings if f.check in CAUSES and f.verdict == "problem"), None)
    if first is None:
        return findings
    return [
        f
        if f is first or f.verdict == "ok" or findings.index(f) < findings.index(first)
        else replace(
            f,
            summary=f"{f.summary} (may follow from {first.check})",
            evidence={**f.evidence, "may_follow_from": first.check},
        )
        for f in findings
    ]


def verdict_of(value: float | None, warning: float, problem: float) -> str:
    """ "problem" when value ≥ problem, "warning" when ≥ warning, else "ok" (None: ok)."""
    if value is None:
        return "ok"
    return "problem" if value >= problem else ("warning" if value >= warning else "ok")


__all__ = ["CAUSES", "CHECKS", "SYMPTOMS", "VERDICTS", "Finding", "note_consequences", "ordered", "verdict_of"]
