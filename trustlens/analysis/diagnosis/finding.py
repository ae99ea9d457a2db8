"""A doctor finding and the order findings are listed in."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from trustlens.analysis.diagnosis import registry

VERDICTS = ("ok", "warning", "problem")  # in increasing severity
# views of the registry kept for readers of earlier versions, read when asked for
_VIEWS: dict[str, dict[str, str]] = {"CHECKS": {}, "CAUSES": {"kind": "cause"}, "SYMPTOMS": {"kind": "symptom"}}


def __getattr__(name: str) -> tuple[str, ...]:
    """CHECKS, CAUSES, SYMPTOMS: the registered checks' names (all, the causes, the symptoms)."""
    if name in _VIEWS:
        return registry.names(**_VIEWS[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Finding:
    """One check's result on a run."""

    check: str  # a registered check (trustlens.analysis.diagnosis.registry)
    verdict: str  # "ok", "warning" or "problem"
    summary: str  # one line: what the data show
    evidence: dict[str, Any] = field(default_factory=dict)  # the statistic, its threshold, steps, example tokens
    fix: str = ""  # one line: the likely fix ("" when there is nothing to fix)
    strength: float = 0.0  # the statistic over its problem threshold (≥ 1 at a problem): orders findings of one verdict

    def __post_init__(self) -> None:
        registry.get(self.check)  # an unknown check raises, naming the registered ones
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
    """Most severe first: by verdict (problem, warning, ok), then the root causes in their
    registered order (a cause can raise the checks after it), then the symptoms by strength
    (largest first)."""
    checks, causes = registry.names(), registry.names(kind="cause")
    return sorted(
        findings,
        key=lambda f: (
            -VERDICTS.index(f.verdict),
            f.check not in causes,
            checks.index(f.check) if f.check in causes else 0,
            -min(f.strength, 1e6),
            checks.index(f.check),
        ),
    )


def note_consequences(findings: list[Finding]) -> list[Finding]:
    """`findings` (ordered) with every later non-ok finding after the first cause found a
    problem marked as possibly following from it (summary suffix, evidence "may_follow_from")."""
    causes = registry.names(kind="cause")
    first = next((f for f in findings if f.check in causes and f.verdict == "problem"), None)
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


__all__ = ["VERDICTS", "Finding", "note_consequences", "ordered", "verdict_of"]
