"""The doctor's `routing` check (issue 49.4): on a mixture-of-experts run, is routing the cause
of the mismatch? The engine and the trainer routing a token to different experts makes its
log-probabilities differ; the check reads how much of the run's k3 the tokens with a flipped
layer carry above what they would at the unflipped tokens' mean (trustlens.analysis.routing's
`k3_excess_share`) and names the layers that flip most (the exact routing table).

Verdict: problem when the flipped tokens carry at least half of the run's k3 and the excess is
at least a quarter of it (routing explains a large part: most tokens of a big MoE run flip
somewhere, so the carried share alone does not say it); warning when the excess is ≥ 10%; ok
otherwise, and "ok, dense run" without routing recorded.
"""

from __future__ import annotations

from trustlens.analysis.diagnosis.finding import Finding
from trustlens.analysis.diagnosis.inputs import Inputs
from trustlens.analysis.diagnosis.registry import check
from trustlens.analysis.routing import flipped_layers, routing_share

CARRIED = 0.5  # a problem needs the flipped tokens to carry this share of Σ k3 ...
PROBLEM_EXCESS = 0.25  # ... and this share above the unflipped tokens' mean
WARNING_EXCESS = 0.10
FIX = (
    "replay the engine's routing in the trainer (router replay, R3: verl actor.router_replay.mode, "
    "slime/Miles, NeMo-RL), or run the engine's router (gate) in fp32, the trainer's precision"
)


@check("routing", kind="symptom", cadence="every", order=50)
def routing_check(inp: Inputs) -> Finding:
    """The `routing` finding of a run's inputs (module docstring)."""
    source = inp.run if inp.run is not None else inp.tokens
    share = routing_share(source)
    if share is None:
        return Finding("routing", "ok", "ok, dense run: no routed experts recorded")
    layers = flipped_layers(inp.run) if inp.run is not None else []
    evidence = {
        "tokens": share.tokens,
        "flipped_share": share.flipped_share,
        "k3_share": share.k3_share,
        "k3_excess_share": share.k3_excess_share,
        "dlogp_share": share.dlogp_share,
        "dlogp_excess_share": share.dlogp_excess_share,
        "k3_flipped": share.k3_flipped,
        "k3_unflipped": share.k3_unflipped,
        "layers": layers,
        "thresholds": {"carried": CARRIED, "warning_excess": WARNING_EXCESS, "problem_excess": PROBLEM_EXCESS},
    }
    carried, excess = share.k3_share or 0.0, share.k3_excess_share
    where = ", ".join(f"{entry['layer']} ({entry['flip_rate']:.0%} flipped)" for entry in layers)
    at = f"; layers flipping most: {where}" if where else ""
    flipped = f"{share.flipped_share:.1%} of the tokens were routed differently by the engine and the trainer"
    if excess is None:  # every token flipped: no unflipped baseline to compare with
        return Finding(
            "routing",
            "warning" if carried > 0 else "ok",
            f"{flipped}: every one, so routing's part cannot be told from the rest{at}",
            evidence,
            FIX if carried > 0 else "",
        )
    verdict = (
        "problem"
        if carried >= CARRIED and excess >= PROBLEM_EXCESS
        else ("warning" if excess >= WARNING_EXCESS else "ok")
    )
    beyond = (
        f"{excess:.0%} above the unflipped tokens' mean"
        if excess > 0
        else "no more than the unflipped tokens' mean would give them"
    )
    summary = (
        f"{flipped}; they carry {carried:.0%} of the run's k3, {beyond} "
        f"(mean k3 {share.k3_flipped or 0:.3g} vs {share.k3_unflipped or 0:.3g} nats){at}"
    )
    if verdict == "problem":
        summary = f"routing causes most of the mismatch: {summary}"
    fix = FIX if verdict != "ok" else ""
    return Finding("routing", verdict, summary, evidence, fix, strength=excess / PROBLEM_EXCESS)
