"""The doctor's `exact` check: is μ = π_old bit for bit (`trustlens.analysis.certify`)?

Most engines are not meant to be exact (bf16 weights, other kernels), and for them a low
bit-equal share is no bug: ok. An engine meant to be zero-mismatch (batch-invariant or
deterministic inference, the trainer's kernels) shows a share near 1; where it is at least NEAR
but not 1, the engine leaks (a batch-dependent reduction, decode vs prefill kernels): a warning
that names where the tokens differ first. Never a problem: the other checks name the bugs.
"""

from __future__ import annotations

from trustlens.analysis.certify import CertifyInputError, certify
from trustlens.analysis.diagnosis.finding import Finding
from trustlens.analysis.diagnosis.inputs import Inputs
from trustlens.analysis.diagnosis.registry import check

NEAR = 0.9  # bit-equal share from which an engine reads as meant to be exact


@check("exact", kind="symptom", cadence="every", order=40)
def exact_check(inp: Inputs) -> Finding:
    """The `exact` finding of a run (module docstring); strength = share / NEAR at a warning."""
    try:
        cert = certify(inp.run if inp.run is not None else inp.tokens)
    except CertifyInputError as err:
        return Finding("exact", "ok", f"not judged: {err}")
    t = cert.tokens
    evidence = {
        "share": t["share"],
        "compared": t["compared"],
        "max_abs_diff": t["max_abs_diff"],
        "precision": t["precision"],
        "near": NEAR,
        "where": cert.where(),
        "first_differing": t["first_differing"],
    }
    if cert.verdict != "not equal":
        summary = f"log μ = log π_old ({cert.verdict}, {t['precision']}) on all {t['compared']:,} tokens"
        return Finding("exact", "ok", summary, evidence)
    summary = f"log μ = log π_old bit for bit on {t['share']:.1%} of {t['compared']:,} tokens"
    if t["share"] < NEAR:
        return Finding("exact", "ok", f"{summary}: not a zero-mismatch engine", evidence)
    where = "; ".join(cert.where()[:1] + [w for w in cert.where() if w.startswith("batch composition: only")])
    return Finding(
        "exact",
        "warning",
        f"{summary}, not all: an engine meant to be exact is not ({where})",
        evidence,
        fix="make the engine's kernels batch-invariant and the trainer's the same (vLLM VLLM_BATCH_INVARIANT=1, "
        "SGLang --enable-deterministic-inference); `trustlens certify RUN` says where the tokens differ",
        strength=t["share"] / NEAR,
    )


__all__ = ["NEAR", "exact_check"]
