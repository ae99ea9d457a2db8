"""`ActiveRule`: the trustlens rule a framework's configured loss is recorded with, the one shape
every integration's `rules` module returns (trl `active_rule_of`, verl `verl_active_rule`,
openrlhf `openrlhf_active_rule`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ActiveRule:
    """The trustlens rule that blocks the tokens a framework's loss blocks, with the framework's
    thresholds; `name` None where no trustlens rule does (`note` says why)."""

    name: str | None  # the trustlens rule (trustlens.rules.RULES); None: no rule reproduces the loss
    low: float | None = None  # its low threshold as the framework sets it; None: the rule's default
    high: float | None = None  # its high threshold as the framework sets it; None: the rule's default
    note: str = ""  # what the framework's loss does, in words (run.json config "loss")

    @property
    def thresholds(self) -> tuple[float | None, float | None]:
        """(low, high), the form a rule set's {name: (low, high)} takes."""
        return self.low, self.high


__all__ = ["ActiveRule"]
