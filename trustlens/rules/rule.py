"""`Rule`, one trust-region rule of docs/rules.md: its thresholds, anchor, distance, level and loss
weight, validated when built, and its manifest form. The built-in rules are registered in
trustlens.rules.registry, the one place rules are listed. Imports no torch.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

Anchor = Literal["mu", "old"]
Measure = Literal["ratio", "log_ratio", "binary_tv", "binary_kl", "topk_tv", "topk_kl"]
WeightKind = Literal["ratio", "cispo", "tis", "seq_ratio", "seq_tis", "geo_mean"]
# How a sequence rule summarises the per-token log-ratios of a response: "mean" (the log of the
# geometric mean of the token ratios) or "sum" (the log of their product).
Statistic = Literal["mean", "sum"]
# Which side of the region a rule blocks: "push" only the updates that push π further out
# (the direction condition), "both" every A ≠ 0 token outside the region (a rejection mask).
Sides = Literal["push", "both"]
# The policy whose ratio to the anchor a rule measures: π (the policy being updated) or π_old
# (verl's rollout correction and IcePop measure π_old/μ, fixed within a step).
Policy = Literal["pi", "old"]
# A batch rule's selection over the response tokens of one batch by the covariance
# cov_t = (log π_t − mean log π)(A_t − mean A) (trustlens.rules.batch): "clip" (Clip-Cov: no
# gradient for a seeded random share of the tokens with cov in (cov_low, cov_high)) or "kl"
# (KL-Cov: a KL penalty on the top share of the tokens by cov).
Covariance = Literal["clip", "kl"]
# A rule's level (`Rule.level`): it decides per token, per response (a statistic), or over the
# batch (a covariance selection).
Level = Literal["token", "sequence", "batch"]
# The measures that are total variations, in [0, 1]: their thresholds are at most 1.
TV_MEASURES = ("binary_tv", "topk_tv")
# The loss weights computed per response: they need the response mask (trustlens.rules.sequence).
SEQUENCE_WEIGHTS = ("seq_ratio", "seq_tis", "geo_mean")
# The fields of a batch rule, written to a manifest only where set.
COV_FIELDS = ("cov", "cov_ratio", "cov_low", "cov_high", "kl_coef")


def _check_threshold(rule: str, what: str, value: object, *, above: float = 0.0, strict: bool = False) -> float:
    """`value` as a float, or ValueError naming the rule and the threshold: it must be a finite
    real number ≥ `above` (> with strict=True)."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not real or not math.isfinite(value) or value < above or (strict and value == above):  # type: ignore[operator, arg-type]
        bound = f"{'>' if strict else '≥'} {above:g}"
        raise ValueError(f"rule {rule!r}: {what} must be a finite number {bound}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Rule:
    """One trust-region rule: its thresholds, its anchor, its level and the loss weight it trains with.

    Validated when built: thresholds finite and ≥ 0 (a blocking rule needs both; ≤ 1 for a TV), a
    known anchor, measure, weight, statistic, sides and policy, a finite tis_cap > 0 for the
    "tis"/"seq_tis" weights, a dual_clip > 1, and for a batch rule (`cov`) a cov_ratio in (0, 1],
    cov_low ≤ cov_high (Clip-Cov) or a kl_coef ≥ 0 (KL-Cov). Errors name the rule and the field.
    """

    name: str  # registry key; also the suffix of the `blocked_<name>` column of a recorded run
    low: float | None  # threshold on the distance when A < 0; None: no such threshold
    high: float | None  # threshold when A > 0; for cispo the IS-weight cap is 1 + high
    anchor: Anchor  # centre of the trust region: "mu" (rollout policy) or "old" (π_old)
    measure: Measure | None  # the distance compared with low/high; None: the rule never blocks
    description: str  # one line, for docs, the dashboard and the CLI
    weight: WeightKind = "ratio"  # the loss weight w, see trustlens.rules.loss.policy_loss
    tis_cap: float | None = None  # "tis" / "seq_tis" weights: C_tis, the truncation of π_old/μ
    statistic: Statistic | None = None  # sequence rules: the response's statistic; None: per token
    sides: Sides = "push"  # "push": the direction condition; "both": a rejection mask
    policy: Policy = "pi"  # the numerator of the measured ratio: π, or π_old (anchor μ only)
    dual_clip: float | None = None  # c > 1: also block A < 0 tokens with ratio > c (dual-clip PPO)
    cov: Covariance | None = None  # batch rules: the covariance selection; None: token or sequence rule
    cov_ratio: float | None = None  # batch rules: the share of the batch's response tokens selected, in (0, 1]
    cov_low: float | None = None  # Clip-Cov: a selected token's cov is > cov_low (verl clip_cov_lb)
    cov_high: float | None = None  # Clip-Cov: ... and < cov_high (verl clip_cov_ub), ≥ cov_low
    kl_coef: float | None = None  # KL-Cov: the coefficient of the penalty |log π − log π_old|, ≥ 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a rule's name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.description, str):
            raise TypeError(f"rule {self.name!r}: description must be a string, got {type(self.description).__name__}")
        for field, value, allowed in (
            ("anchor", self.anchor, get_args(Anchor)),
            ("measure", self.measure, (*get_args(Measure), None)),
            ("weight", self.weight, get_args(WeightKind)),
            ("statistic", self.statistic, (*get_args(Statistic), None)),
            ("sides", self.sides, get_args(Sides)),
            ("policy", self.policy, get_args(Policy)),
        ):
            if value not in allowed:
                raise ValueError(f"rule {self.name!r}: {field} must be one of {allowed}, got {value!r}")
        if self.measure in ("topk_tv", "topk_kl") and (self.anchor != "mu" or self.policy != "pi"):
            raise ValueError(
                f"rule {self.name!r}: the top-K measures are anchored on μ and measure π, "
                f"got anchor {self.anchor!r}, policy {self.policy!r}"
            )
        if self.policy == "old" and self.anchor != "mu":
            raise ValueError(f"rule {self.name!r}: policy 'old' measures π_old against μ; anchor must be 'mu'")
        if self.statistic is not None and self.measure not in ("ratio", None):
            raise ValueError(
                f"rule {self.name!r}: a sequence rule compares its sequence ratio with low/high, so its "
                f"measure must be 'ratio' (or None), got {self.measure!r}"
            )
        if self.weight == "seq_ratio" and self.statistic is None:
            raise ValueError(f"rule {self.name!r}: weight 'seq_ratio' needs a statistic ('mean' or 'sum')")
        if self.weight == "geo_mean" and self.measure != "log_ratio":
            raise ValueError(f"rule {self.name!r}: weight 'geo_mean' clips log-ratios: measure must be 'log_ratio'")
        self._check_thresholds()
        if self.weight in ("tis", "seq_tis"):
            cap = _check_threshold(self.name, "tis_cap", self.tis_cap, strict=True)
            object.__setattr__(self, "tis_cap", cap)
        elif self.tis_cap is not None:
            raise ValueError(f"rule {self.name!r}: tis_cap applies only to weight 'tis' or 'seq_tis'")
        if self.dual_clip is not None:
            c = _check_threshold(self.name, "dual_clip", self.dual_clip, above=1.0, strict=True)
            if self.measure != "ratio" or self.statistic is not None:
                raise ValueError(f"rule {self.name!r}: dual_clip applies to token rules with the 'ratio' measure")
            object.__setattr__(self, "dual_clip", c)
        self._check_covariance()

    def _check_covariance(self) -> None:
        fields = {
            "cov_ratio": self.cov_ratio,
            "cov_low": self.cov_low,
            "cov_high": self.cov_high,
            "kl_coef": self.kl_coef,
        }
        if self.cov is None:
            given = [k for k, v in fields.items() if v is not None]
            if given:
                raise ValueError(
                    f"rule {self.name!r}: {', '.join(given)} apply only to a batch rule (cov 'clip' or 'kl')"
                )
            return
        if self.cov not in get_args(Covariance):
            raise ValueError(f"rule {self.name!r}: cov must be one of {get_args(Covariance)}, got {self.cov!r}")
        if self.anchor != "old" or self.statistic is not None or self.policy != "pi":
            raise ValueError(f"rule {self.name!r}: a batch rule measures π against π_old per token (anchor 'old')")
        ratio = _check_threshold(self.name, "cov_ratio", self.cov_ratio, strict=True)
        if ratio > 1:
            raise ValueError(
                f"rule {self.name!r}: cov_ratio is a share of the batch's tokens, in (0, 1], got {ratio!r}"
            )
        object.__setattr__(self, "cov_ratio", ratio)
        own = ("cov_low", "cov_high") if self.cov == "clip" else ("kl_coef",)
        for field in fields.keys() - {"cov_ratio", *own}:
            if fields[field] is not None:
                raise ValueError(f"rule {self.name!r}: {field} does not apply to cov {self.cov!r}")
        if self.cov == "kl":
            object.__setattr__(self, "kl_coef", _check_threshold(self.name, "kl_coef", self.kl_coef))
            return
        for field in own:
            value = fields[field]
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"rule {self.name!r}: {field} must be a finite number, got {value!r}")
            object.__setattr__(self, field, float(value))
        if self.cov_low > self.cov_high:  # type: ignore[operator]
            raise ValueError(
                f"rule {self.name!r}: cov_low must be ≤ cov_high, "
                f"got cov_low={self.cov_low!r} > cov_high={self.cov_high!r}"
            )

    def _check_thresholds(self) -> None:
        for side in ("low", "high"):
            value = getattr(self, side)
            if value is not None:
                object.__setattr__(self, side, _check_threshold(self.name, side, value))
                if self.measure in TV_MEASURES and value > 1:  # a total variation is at most 1
                    raise ValueError(
                        f"rule {self.name!r}: {side} must be ≤ 1 for the {self.measure} measure (a total "
                        f"variation is in [0, 1], a bound above 1 never blocks), got {value!r}"
                    )
            elif self.measure is not None or (side == "high" and self.weight == "cispo"):
                raise ValueError(f"rule {self.name!r}: {side} is required (the rule uses it), got None")

    @property
    def blocks(self) -> bool:
        """Whether the rule can block a token at all (cispo and pg_is never do)."""
        return self.measure is not None or self.cov is not None

    @property
    def level(self) -> Level:
        """The rule's level: "batch" when it selects tokens by their covariance over the batch,
        "sequence" when it decides per response from a statistic, else "token"."""
        if self.cov is not None:
            return "batch"
        return "token" if self.statistic is None else "sequence"

    @property
    def needs(self) -> tuple[str, ...]:
        """The optional inputs of `evaluate` / `policy_loss` this rule requires."""
        reads_old = self.anchor == "old" or self.policy == "old" or self.weight in ("tis", "seq_tis")
        needs = ["old_logp"] if reads_old else []
        if self.measure in ("topk_tv", "topk_kl"):
            needs.append(self.measure)
        if self.level in ("sequence", "batch") or self.weight in SEQUENCE_WEIGHTS:
            needs.append("response_mask")
        return tuple(needs)

    def with_thresholds(self, low: float | None = None, high: float | None = None) -> Rule:
        """This rule with `low` / `high` replaced where given (None keeps the default).

        Raises ValueError for a threshold that is negative or not finite, or that the rule does
        not have (e.g. `low` for cispo, either for pg_is).
        """
        for side, value in (("low", low), ("high", high)):
            if value is not None and getattr(self, side) is None:
                raise ValueError(f"rule {self.name!r} has no {side} threshold; got {side}={value!r}")
        return replace(self, low=self.low if low is None else low, high=self.high if high is None else high)

    def manifest_entry(self) -> dict[str, Any]:
        """The rule as a run's manifest records it (JSON types); `Rule.from_manifest` reads it back.
        The fields of the corrections are written only where they differ from their defaults."""
        entry = {
            "low": self.low,
            "high": self.high,
            "anchor": self.anchor,
            "measure": self.measure,
            "weight": self.weight,
            "tis_cap": self.tis_cap,
            "description": self.description,
        }
        optional = {"statistic": None, "sides": "push", "policy": "pi", "dual_clip": None, **dict.fromkeys(COV_FIELDS)}
        return entry | {k: getattr(self, k) for k, default in optional.items() if getattr(self, k) != default}

    @classmethod
    def from_manifest(cls, name: str, entry: Mapping[str, Any], builtin: Rule | None = None) -> Rule:
        """The rule `name` as a manifest entry records it ({low, high, anchor, measure, ...}), so
        that a custom rule a run evaluated can be evaluated again without its code. `builtin`: the
        registry's rule of that name, if any (`trustlens.rules.rule_from_manifest` passes it): an
        entry without "measure" (written before it was recorded) takes it with the entry's
        thresholds, ValueError without it; an entry without a description takes its description."""
        if not isinstance(entry, Mapping):
            raise ValueError(f"rules[{name!r}] must be a mapping like {{'low': …, 'high': …}}, got {entry!r}")
        if "measure" not in entry:
            if builtin is None:
                raise ValueError(
                    f"rule {name!r} is not a built-in rule and its record names no measure; "
                    "it cannot be evaluated again (read a manifest with trustlens.rules.rule_from_manifest)"
                )
            return builtin.with_thresholds(entry.get("low"), entry.get("high"))
        base = builtin
        return cls(
            name=name,
            low=entry.get("low"),
            high=entry.get("high"),
            anchor=entry.get("anchor", "mu"),
            measure=entry["measure"],
            description=entry.get("description") or (base.description if base else ""),
            weight=entry.get("weight") or "ratio",
            tis_cap=entry.get("tis_cap"),
            statistic=entry.get("statistic"),
            sides=entry.get("sides") or "push",
            policy=entry.get("policy") or "pi",
            dual_clip=entry.get("dual_clip"),
            **{k: entry.get(k) for k in COV_FIELDS},
        )
