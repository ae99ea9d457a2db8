"""`certify(run)`: the verdict on a zero-mismatch claim, μ = π_old, and how it reads.

Verdicts (`VERDICTS`):
    bit-exact         every compared token's log μ and log π_old are the same float32 value;
    within precision  every one equal at the recorded precision, coarser than float32 (a column
                      recorded in bf16): the bits below it are not known;
    not equal         some differ: where first, by position, prefill vs decode, batch composition.

What a CI job requires (`REQUIREMENTS`, `Certificate.certified`): ``bit-exact`` (the default),
``precision`` (bit-exact or within precision) or ``distribution`` (bit-exact, and μ's recorded
top-K equal to π_old's at update 0, `compare.distribution`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from trustlens.analysis.certify.compare import concentrated, distribution, sampled_tokens
from trustlens.analysis.certify.tokens import FLOAT32, CertifyInputError, compared_tokens

VERDICTS = ("bit-exact", "within precision", "not equal")
REQUIREMENTS = ("bit-exact", "precision", "distribution")


@dataclass(frozen=True)
class Certificate:
    """A run's certificate (`certify`)."""

    run: str  # the run's name
    verdict: str  # one of VERDICTS
    reference: str  # where log π_old was read from (tokens.REFERENCES)
    precision: dict[str, str]  # "mu", "old" -> "float32" or "bf16" (as recorded)
    tokens: dict[str, Any]  # the sampled-token comparison (compare.sampled_tokens)
    distribution: dict[str, Any] | None  # the top-K comparison at update 0 (compare.distribution); None: not recorded
    notes: list[str] = field(default_factory=list)  # what the comparison covers, in words

    @property
    def distribution_equal(self) -> bool | None:
        """Every update-0 token's recorded top-K within the tolerance (None: no top-K recorded)."""
        d = self.distribution
        return None if d is None else d["within"] == d["tokens"]

    def certified(self, require: str = "bit-exact") -> bool:
        """Whether the certificate meets `require` (REQUIREMENTS); CertifyInputError for
        ``distribution`` on a run without top-K columns."""
        if require not in REQUIREMENTS:
            raise ValueError(f"require must be one of {', '.join(REQUIREMENTS)}, got {require!r}")
        if require == "precision":
            return self.verdict in VERDICTS[:2]
        if require == "distribution":
            if self.distribution_equal is None:
                raise CertifyInputError(
                    f"{self.run}: no top-K recorded (topk_tv is null at update 0): --require distribution needs "
                    "record(logits=..., mu_topk_ids=..., mu_topk_logp=...) on each step's first update"
                )
            return self.verdict == "bit-exact" and self.distribution_equal
        return self.verdict == "bit-exact"

    def where(self) -> list[str]:
        """Where log μ and log π_old differ, in words (empty when they do not)."""
        t = self.tokens
        if not t["compared"] - t["equal"]:
            return []
        first = t["first_differing"][0]
        lines = [f"first at step {first['step']} sample {first['sample']} pos {first['pos']}"]
        lines.append(
            "by position: "
            + ", ".join(f"{r['positions']}: {r['differing']} of {r['compared']}" for r in t["by_position"])
        )
        phases = [(name, t[name]) for name in ("prefill", "decode") if t[name]]
        lines.append(
            "prefill (pos 0) / decode (pos ≥ 1): "
            + ", ".join(f"{name} {p['differing']} of {p['compared']} ({p['share']:.1%})" for name, p in phases)
        )
        if t["by_row"] is None:
            lines.append("batch composition: not known in a sampled run")
            return lines
        sizes = ", ".join(str(b) for b in t["batch_sizes"])
        rows = concentrated(t["by_row"], "row")
        lines.append(
            f"batch composition: only row{'s' if any(c in rows for c in '–,') else ''} {rows} of each step's batch "
            f"of {sizes} (samples in id order) differ"
            if rows
            else f"batch composition: differing tokens on every row of the step's batch of {sizes}"
        )
        live = concentrated(t["by_decode_batch"], "live")
        if live:
            lines.append(f"decode batch: differs only where {live} of the step's sequences were still generating")
        return lines

    def to_json(self) -> dict[str, Any]:
        """The `trustlens certify --json` object (every field; non-finite floats as floats)."""
        return {
            "run": self.run,
            "verdict": self.verdict,
            "reference": self.reference,
            "precision": self.precision,
            "tokens": self.tokens,
            "distribution": self.distribution,
            "distribution_equal": self.distribution_equal,
            "where": self.where(),
            "notes": self.notes,
        }


def certify(run: Any) -> Certificate:
    """The certificate of `run` (a Run, a run path or a token LazyFrame); CertifyInputError
    (a ValueError) when the run cannot be certified as recorded (tokens.compared_tokens)."""
    if isinstance(run, str | os.PathLike):
        from trustlens.run import load_run

        run = load_run(run)
    c = compared_tokens(run)
    tokens = sampled_tokens(c)
    if tokens["equal"] < tokens["compared"]:
        verdict = "not equal"
    else:
        verdict = "bit-exact" if tokens["precision"] == FLOAT32 else "within precision"
    return Certificate(c.name, verdict, c.reference, c.precision, tokens, distribution(c), c.notes)


__all__ = ["REQUIREMENTS", "VERDICTS", "Certificate", "certify"]
