"""Which columns a `TokenRecorder`'s calls fill: the rules each call can decide, the optional
columns it records, and the manifest's `anchor` and `missing` that follow from them.

A rule is decided by a call when the caller gives its decision (`blocked`) or the call holds
every input the rule needs (`Rule.needs`: π_old, top-K). Rules asked for by name must be
decidable at every call; with the default rule set, an undecidable rule's `blocked_<rule>`
column stays null and the manifest lists it as missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from trustlens.rules import Rule, require_inputs
from trustlens.run import blocked_column

# token columns a caller may leave null; the manifest's "missing" lists those never recorded
OPTIONAL_COLUMNS = ("mu_logp", "old_logp", "topk_tv", "topk_kl", "entropy")


class RecordedColumns:
    """The rule and column bookkeeping of one recorder.

    rules: the evaluated rules; given: whether the caller named them (then each must be decidable
    at every call) or they are the default set (decided where the inputs allow it)."""

    def __init__(self, rules: list[Rule], *, given: bool) -> None:
        self.rules = rules
        self.given = given
        self._evaluable: dict[tuple, tuple[list[Rule], set[str]]] = {}  # see `evaluable`
        self._anchor: str | None = None
        self._recorded: set[str] = set()  # optional columns recorded at least once

    def check_blocked(self, blocked: object, shape: tuple[int, int]) -> dict[str, torch.Tensor]:
        """The caller's rule decisions {rule: (B, T) bool}, checked."""
        if blocked is None:
            return {}
        if not isinstance(blocked, Mapping):
            raise ValueError(f"blocked must be a mapping rule name -> (B, T) bool tensor, got {type(blocked).__name__}")
        names = [r.name for r in self.rules]
        for rule, decision in blocked.items():
            if rule not in names:
                raise ValueError(f"blocked[{rule!r}]: not an evaluated rule of this recorder ({names})")
            if not isinstance(decision, torch.Tensor) or decision.dtype != torch.bool or tuple(decision.shape) != shape:
                got = (
                    f"{decision.dtype} {tuple(decision.shape)}"
                    if isinstance(decision, torch.Tensor)
                    else type(decision).__name__
                )
                raise ValueError(f"blocked[{rule!r}] must be a bool tensor of shape {shape}, got {got}")
        return dict(blocked)

    def evaluable(self, columns: tuple[str, ...], decided: tuple[str, ...]) -> tuple[list[Rule], set[str]]:
        """(the rules a call with per-token inputs `columns` and the caller's decisions of the
        rules `decided` can decide, the optional columns and `blocked_<rule>` columns it fills).
        ValueError when a rule the caller asked for needs an input not given. Worked out once
        per (columns, decided)."""
        key = (columns, decided)
        if key not in self._evaluable:
            present = {k: k in columns for k in ("old_logp", "topk_tv", "topk_kl")} | {"response_mask": True}
            if self.given:  # the caller asked for these rules: each must be decidable
                for rule in self.rules:
                    require_inputs(rule, present)
            evaluable = [r for r in self.rules if r.name in decided or all(present[a] for a in r.needs)]
            recorded = {k for k in columns if k in OPTIONAL_COLUMNS} | {blocked_column(r.name) for r in evaluable}
            self._evaluable[key] = (evaluable, recorded)
        return self._evaluable[key]

    def note_anchor(self, anchor: str, recorded: set[str]) -> dict[str, Any] | None:
        """The manifest's new `anchor` ("mu", "old", or "mixed" once both were used) and
        `missing` (optional and `blocked_<rule>` columns never recorded) after a call anchored on
        `anchor` that fills the columns `recorded`; None when they did not change."""
        new_anchor = anchor if self._anchor in (None, anchor) else "mixed"
        if new_anchor == self._anchor and recorded <= self._recorded:
            return None
        self._anchor = new_anchor
        self._recorded |= recorded
        wanted = list(OPTIONAL_COLUMNS) + [blocked_column(r.name) for r in self.rules]
        return {"anchor": new_anchor, "missing": [k for k in wanted if k not in self._recorded]}
