"""The doctor's `routing` check (issue 49.4): on a mixture-of-experts run, is routing the cause
of the mismatch? The engine and the trainer routing a token to different experts makes its
log-probabilities differ; the check reads how much of the run's k3 the tokens with a flipped
layer carry above what they would at the unflipped tokens' mean (trustlens.analysis.routing's
`k3_excess_share`) and names the layers that flip most (the exact routing table).

Verdict: problem when the flipped tokens carry at least half of the run's k3 and the excess is
at least a quarter of it (routing explains a large part: most tokens of a big MoE run flip
somewhere, so the carried share alone does not say it); warning when the excess is ≥ 10%; ok
otherwise, and "ok, dense run" without routing recorded.

A stale μ (`Inputs.fresh`: the engine's weights are older than π_old's) moves the engine's
experts and its log-probabilities together, so on its tokens the flipped ones carry the
staleness's mismatch too. Then the check judges the tokens sampled with π_old's weights when
they hold at least MIN_FLIPPED flipped tokens; else, where the run logged the shadow forward
(`measured_split`), its measured share of k3: problem at ≥ MEASURED_PROBLEM, warning at
≥ MEASURED_WARNING; else it does not judge. Wherever the run logged the shadow forward, the
summary and evidence carry the measured split beside the estimate.
"""

from __future__ import annotations

from dataclasses import asdict

from trustlens.analysis.diagnosis.finding import Finding
from trustlens.analysis.diagnosis.inputs import Inputs
from trustlens.analysis.diagnosis.registry import check
from trustlens.analysis.routing import MeasuredSplit, RoutingShare, flipped_layers, measured_split, routing_share

CARRIED = 0.5  # a problem needs the flipped tokens to carry this share of Σ k3 ...
PROBLEM_EXCESS = 0.25  # ... and this share above the unflipped tokens' mean
WARNING_EXCESS = 0.10
MIN_FLIPPED = 50  # flipped tokens (Σ w) sampled with π_old's weights needed to judge a stale run on them
MEASURED_PROBLEM = 0.5  # the shadow forward's measured share of k3 that makes routing the main cause
MEASURED_WARNING = 0.25
FIX = (
    "replay the engine's routing in the trainer (router replay, R3: verl actor.router_replay.mode, "
    "slime/Miles, NeMo-RL), or run the engine's router (gate) in fp32, the trainer's precision"
)


def _measured(split: MeasuredSplit | None, part: str = "routing's part") -> str:
    """The measured split in words ("" without one)."""
    if split is None or split.k3_share is None:
        return ""
    d = f" ({split.dlogp_share:.0%} of Σ|Δ log p|)" if split.dlogp_share is not None else ""
    return f"; the shadow forward measured {part} at {split.k3_share:.0%} of k3{d} over {split.steps} steps"


@check("routing", kind="symptom", cadence="every", order=50)
def routing_check(inp: Inputs) -> Finding:
    """The `routing` finding of a run's inputs (module docstring)."""
    source = inp.run if inp.run is not None else inp.tokens
    share = routing_share(source)
    if share is None:
        return Finding("routing", "ok", "ok, dense run: no routed experts recorded")
    split = measured_split(inp.run) if inp.run is not None else None
    layers = flipped_layers(inp.run) if inp.run is not None else []
    evidence = {
        **asdict(share),
        "layers": layers,
        "split": None if split is None else asdict(split),
        "thresholds": {"carried": CARRIED, "warning_excess": WARNING_EXCESS, "problem_excess": PROBLEM_EXCESS},
    }
    where = ", ".join(f"{entry['layer']} ({entry['flip_rate']:.0%} flipped)" for entry in layers if entry["flips"])
    at = f"; layers flipping most: {where}" if where else ""
    if inp.config.get("routing_replay") is True:  # π was computed with μ's experts: nothing can flip
        return Finding(
            "routing",
            "ok",
            "ok, routing replayed (R3): π_old and π use the engine's experts, so no token is routed differently"
            + _measured(split, "the part replay removes from the trainer's own routing"),
            evidence,
        )
    flipped = f"{share.flipped_share:.1%} of the tokens were routed differently by the engine and the trainer"
    fresh, stale = inp.fresh
    on = ""
    if stale is not None:
        judged = routing_share(fresh)
        n_flipped = 0.0 if judged is None else judged.tokens * judged.flipped_share
        evidence["stale"], evidence["fresh"] = stale, None if judged is None else asdict(judged)
        if judged is None or n_flipped < MIN_FLIPPED:
            return _stale(share, split, stale, n_flipped, evidence, flipped, at)
        share, on = judged, f" on the {judged.tokens:.0f} tokens sampled with π_old's weights ({stale})"
        flipped = f"{share.flipped_share:.1%} of them were routed differently by the engine and the trainer"
    carried, excess = share.k3_share or 0.0, share.k3_excess_share
    measured = _measured(split)
    if excess is None:  # every token flipped: no unflipped baseline to compare with
        return Finding(
            "routing",
            "warning" if carried > 0 else "ok",
            f"{flipped}{on}: every one, so routing's part cannot be told from the rest{measured}{at}",
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
        f"{flipped}{on}; they carry {carried:.0%} of the run's k3, {beyond} "
        f"(mean k3 {share.k3_flipped or 0:.3g} vs {share.k3_unflipped or 0:.3g} nats){measured}{at}"
    )
    if verdict == "problem":
        summary = f"routing causes most of the mismatch: {summary}"
    fix = FIX if verdict != "ok" else ""
    return Finding("routing", verdict, summary, evidence, fix, strength=excess / PROBLEM_EXCESS)


def _stale(
    share: RoutingShare,
    split: MeasuredSplit | None,
    stale: str,
    n_flipped: float,
    evidence: dict,
    flipped: str,
    at: str,
) -> Finding:
    """The finding of a stale μ with too few flipped tokens sampled with π_old's weights: from
    the measured split where the run logged one, else not judged."""
    carried = f"{flipped}, carrying {share.k3_share or 0:.0%} of the run's k3"
    why = (
        f"μ is stale ({stale}): the engine's older weights move its experts and its log-probabilities "
        f"together, so that is not routing's doing alone"
    )
    if split is None or split.k3_share is None:
        return Finding(
            "routing",
            "ok",
            f"not judged: {carried}, but {why}, and the tokens sampled with π_old's weights hold "
            f"{n_flipped:.0f} flipped ones (fewer than {MIN_FLIPPED}); record staleness= per token, or run the "
            f"shadow forward (trustlens.routing.replay_split, trustlens train --routing-split-every){at}",
            evidence,
        )
    part = split.k3_share
    verdict = "problem" if part >= MEASURED_PROBLEM else ("warning" if part >= MEASURED_WARNING else "ok")
    summary = f"{carried}; {why}{_measured(split)}{at}"
    if verdict == "problem":
        summary = f"routing causes most of the mismatch: {summary}"
    return Finding(
        "routing", verdict, summary, evidence, FIX if verdict != "ok" else "", strength=part / MEASURED_PROBLEM
    )
