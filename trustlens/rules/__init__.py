"""The trust-region rules (docs/rules.md): their registry, their decision, and the loss they shape.

- `registry`: `Rule`, the built-in `RULES`, `get_rule`, `resolve_rules`.
- `decision`: `decide`, the one decision of every rule, and `evaluate` / `evaluate_all` on tensors.
- `columns`: the same decision on the numpy columns of a recorded run (no torch).
- `batch`: the covariance selection of the batch rules Clip-Cov and KL-Cov.
- `loss`: `policy_loss`, the clipped / masked / reweighted policy-gradient loss of each rule (torch).

Importing this package imports no torch; `trustlens.rules.loss` does.
"""

from trustlens.rules.decision import (
    RULES,
    Anchor,
    Measure,
    Rule,
    RuleSpec,
    TokenInputs,
    WeightKind,
    decide,
    evaluate,
    evaluate_all,
    get_rule,
    require_inputs,
    resolve_rules,
)

__all__ = [
    "RULES",
    "Anchor",
    "Measure",
    "Rule",
    "RuleSpec",
    "TokenInputs",
    "WeightKind",
    "decide",
    "evaluate",
    "evaluate_all",
    "get_rule",
    "require_inputs",
    "resolve_rules",
]
