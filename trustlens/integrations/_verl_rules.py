"""Which trustlens rule a verl run is recorded with: `verl_active_rule` maps verl's policy loss
(the actor config's `policy_loss.loss_mode` and clip ratios, the algorithm's rollout correction)
to the trustlens rule that blocks the same tokens, with verl's thresholds, or to none, with a
note saying why."""

from __future__ import annotations

from typing import Any


def _get(config: Any, name: str, default: Any = None) -> Any:
    """A field of a verl config (dataclass or OmegaConf), or `default`."""
    if config is None:
        return default
    if hasattr(config, "get"):
        try:
            value = config.get(name, default)
        except (TypeError, KeyError):
            value = getattr(config, name, default)
    else:
        value = getattr(config, name, default)
    return default if value is None else value


def verl_active_rule(actor: Any, algorithm: Any = None) -> tuple[str | None, float | None, float | None, str]:
    """(trustlens rule, low, high, note) for verl's policy loss of `actor` (the actor config)
    and `algorithm` (for rollout correction). rule None: no trustlens rule blocks what verl does."""
    mode = _get(_get(actor, "policy_loss"), "loss_mode", "vanilla")
    eps = _get(actor, "clip_ratio", 0.2)
    low, high = _get(actor, "clip_ratio_low", eps), _get(actor, "clip_ratio_high", eps)
    dual = _get(actor, "clip_ratio_c", 3.0)
    correction = _get(algorithm, "rollout_correction")
    token_is = _get(correction, "rollout_is") == "token" and not _get(correction, "bypass_mode", False)
    if mode == "vanilla":
        note = (
            f"verl vanilla PPO clips π/π_old to [1 - {low}, 1 + {high}] (trustlens minirl) and, as dual clip, "
            f"also gives no gradient to A < 0 tokens with π/π_old > {dual}: no trustlens rule blocks those"
        )
        if token_is:
            return "grpo_tis", low, high, note + "; times verl's token-level rollout IS weight min(π_old/μ, C)"
        return "minirl", low, high, note
    if mode == "dppo_tv":
        return "dppo_binary_tv_recompute", low, high, "verl dppo_tv: binary TV mask against π_old"
    if mode == "dppo_kl":
        return "dppo_binary_kl_recompute", low, high, "verl dppo_kl: binary KL mask against π_old"
    if mode == "gpg":
        return None, None, None, "verl gpg: −A·log π with no trust region and no IS weight; no trustlens rule"
    if mode == "cispo":
        return None, None, None, "verl cispo caps π/π_old (trustlens cispo caps π/μ): not the same rule"
    return None, None, None, f"verl loss_mode {mode!r} has no matching trustlens rule"
