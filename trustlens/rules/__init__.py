"""The trust-region rules (docs/rules.md): their registry, their decision, and the loss they shape.

- `registry`: `register_rule`, the registry `RULES` of the built-in rules (the one place rules
  are listed, one entry per rule with its paper), `get_rule`; `Rule` itself is in `rule`.
- `resolve`: `resolve_rules`, the rules a caller names with their thresholds, and
  `rule_from_manifest`, a rule as a run's manifest records it.
- `decision`: `decide`, the one decision of every rule; `RuleInputs.blocked`, the one dispatch
  over a rule's level (token, sequence, batch) for torch and numpy; `evaluate` / `evaluate_all`
  on tensors.
- `sequence`: the per-response statistics of the sequence rules, defined once.
- `columns`: the same decision on the numpy columns of a recorded run (no torch).
- `batch`: the covariance selection of the batch rules Clip-Cov and KL-Cov.
- `loss`: `policy_loss`, the clipped / masked / reweighted policy-gradient loss of each rule (torch).

Importing this package imports no torch; `trustlens.rules.loss` does.
"""

from trustlens.rules.decision import RuleInputs, TokenInputs, decide, evaluate, evaluate_all, require_inputs
from trustlens.rules.registry import CORRECTIONS, RULES, get_rule, register_rule
from trustlens.rules.resolve import RuleSpec, resolve_rules, rule_from_manifest
from trustlens.rules.rule import Anchor, Level, Measure, Rule, WeightKind

__all__ = [
    "CORRECTIONS",
    "RULES",
    "Anchor",
    "Level",
    "Measure",
    "Rule",
    "RuleInputs",
    "RuleSpec",
    "TokenInputs",
    "WeightKind",
    "decide",
    "evaluate",
    "evaluate_all",
    "get_rule",
    "register_rule",
    "require_inputs",
    "resolve_rules",
    "rule_from_manifest",
]
