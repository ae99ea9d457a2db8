"""Which trustlens rule an OpenRLHF run is recorded with: OpenRLHF's `ppo` loss clips π/π_old,
which is trustlens' `minirl` (its dual clip and train/rollout IS correction are named in the note,
no rule blocks the same tokens); its `gspo` loss has no matching rule."""

from __future__ import annotations

from typing import Any

from trustlens.integrations.active_rule import ActiveRule


def openrlhf_active_rule(loss: Any) -> ActiveRule:
    """The trustlens rule (with low, high and a note) for an OpenRLHF `PolicyLoss`."""
    if loss.policy_loss_type != "ppo":
        return ActiveRule(None, note=f"OpenRLHF {loss.policy_loss_type} loss has no matching trustlens rule")
    note = f"OpenRLHF PPO clips π/π_old to [1 - {loss.clip_eps_low}, 1 + {loss.clip_eps_high}] (trustlens minirl)"
    if loss.dual_clip is not None:
        note += f"; dual clip c = {loss.dual_clip} on A < 0 tokens has no trustlens rule"
    if loss.is_correction_level != "off":
        note += f"; train/rollout IS correction ({loss.is_correction_level}, {loss.is_correction_mode}) is not a rule"
    return ActiveRule("minirl", loss.clip_eps_low, loss.clip_eps_high, note)


def policy_loss_of(args: Any) -> Any:
    """The PolicyLoss the actors build from `args` (for the rule the driver names)."""
    from openrlhf.models import PolicyLoss

    actor, correction = args.actor, args.algo.advantage
    return PolicyLoss(
        clip_eps_low=actor.eps_clip_low_high[0],
        clip_eps_high=actor.eps_clip_low_high[1],
        dual_clip=actor.dual_clip,
        policy_loss_type=actor.policy_loss_type,
        is_correction_level=correction.is_correction_level,
        is_correction_mode=correction.is_correction_mode,
        is_correction_gating=correction.is_correction_gating,
        is_correction_threshold=correction.is_correction_threshold,
    )


__all__ = ["openrlhf_active_rule", "policy_loss_of"]
