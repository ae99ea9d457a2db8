"""Rule pickers grouped by level: token rules first, then the sequence rules that decide a whole
response, then the batch rules that select a share of a batch's tokens (docs/rules.md), each
labelled with its level."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import get_args

from trustlens.rules import RULES, Level, rule_from_manifest

# The levels in the order the pickers show them: `Rule.level`'s.
LEVELS: tuple[str, ...] = get_args(Level)


def rule_level(rule: str, specs: Mapping[str, Mapping]) -> str:
    """The rule's level, "token", "sequence" or "batch": as the run recorded it (`specs`, Run.rules), else
    the registry's."""
    spec = specs.get(rule)
    with contextlib.suppress(ValueError, TypeError):
        if spec:
            return rule_from_manifest(rule, spec).level
    return RULES[rule].level if rule in RULES else "token"


def by_level(rules: list[str], specs: Mapping[str, Mapping]) -> list[str]:
    """`rules` grouped by level (token, sequence, batch), each group in the given order."""
    return sorted(rules, key=lambda r: LEVELS.index(rule_level(r, specs)))


def level_label(rule: str, specs: Mapping[str, Mapping]) -> str:
    """The rule's name after its level, for a picker: "sequence · gspo"."""
    return f"{rule_level(rule, specs)} · {rule}"
