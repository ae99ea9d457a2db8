"""Which trustlens rule a verl run is recorded with: `verl_active_rule` maps verl's policy loss
(the actor config's `policy_loss.loss_mode` and clip ratios, the algorithm's rollout correction)
to the trustlens rule that blocks the same tokens, with verl's thresholds, or to none, with a
note saying why."""

from __future__ import annotations

from typing import Any

from trustlens.integrations.active_rule import ActiveRule


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


def verl_active_rule(actor: Any, algorithm: Any = None) -> ActiveRule:
    """The trustlens rule (with low, high and a note) for verl's policy loss of `actor` (the actor config)
    and `algorithm` (for rollout correction). name None: no trustlens rule blocks what verl does.

    verl's losses compare π with its `old_log_prob`: π_old, or μ in rollout correction's bypass
    mode. A rejection mask (`rollout_rs`) is the run's rule where it is set; its PPO clip is then
    recorded as the counterfactual `minirl`."""
    mode = _get(_get(actor, "policy_loss"), "loss_mode", "vanilla")
    eps = _get(actor, "clip_ratio", 0.2)
    low, high = _get(actor, "clip_ratio_low", eps), _get(actor, "clip_ratio_high", eps)
    dual = _get(actor, "clip_ratio_c", 3.0)
    correction = _get(algorithm, "rollout_correction")
    bypass = bool(_get(correction, "bypass_mode", False))
    rejection = _rejection_rule(correction)
    if rejection is not None:
        return rejection
    is_level = None if bypass else _get(correction, "rollout_is")
    lower, upper = _band(_get(correction, "rollout_is_threshold", 2.0))
    if is_level == "token" and lower is not None:  # verl ≥ 0.9: a "lower_upper" band is IcePop
        note = f"verl rollout_is token with the band [{lower:g}, {upper:g}]: IcePop's mask on π_old/μ"
        return ActiveRule("icepop", 1.0 - lower, upper - 1.0, note)
    if mode == "vanilla":
        if bypass:  # old_log_prob is μ: verl's dual-clip PPO against μ is trustlens' dual_clip
            note = f"verl vanilla PPO in bypass mode: PPO clip and dual clip c = {dual} against μ"
            return ActiveRule(
                "dual_clip", low, high, note + ("" if dual == 3.0 else " (trustlens' dual_clip has c = 3)")
            )
        note = (
            f"verl vanilla PPO clips π/π_old to [1 - {low}, 1 + {high}] (trustlens minirl) and, as dual clip, "
            f"also gives no gradient to A < 0 tokens with π/π_old > {dual}: no trustlens rule blocks those"
        )
        if is_level == "token":
            return ActiveRule(
                "grpo_tis", low, high, note + "; times verl's token-level rollout IS weight min(π_old/μ, C)"
            )
        if is_level == "sequence":
            return ActiveRule(
                "grpo_seq_tis", low, high, note + "; times verl's sequence-level IS weight min(Π π_old/μ, C)"
            )
        return ActiveRule("minirl", low, high, note)
    if mode == "gspo":
        return ActiveRule(
            "gspo", low, high, "verl gspo: the geometric-mean ratio against old_log_prob clipped to its band"
        )
    if mode == "geo_mean":
        return ActiveRule("gmpo", low, high, "verl geo_mean (GMPO): token log-ratios clipped to [−low, high]")
    if mode == "dppo_tv":
        return ActiveRule("dppo_binary_tv_recompute", low, high, "verl dppo_tv: binary TV mask against π_old")
    if mode == "dppo_kl":
        return ActiveRule("dppo_binary_kl_recompute", low, high, "verl dppo_kl: binary KL mask against π_old")
    if mode in ("clip_cov", "kl_cov"):
        note = (
            "verl clip_cov: PPO's clip of π/π_old, and no gradient for a random share of each micro-batch's "
            "tokens by cov(log π, A) (trustlens draws with a generator seeded by (step, update), verl with "
            "torch's global one: the same candidates and count, another draw)"
            if mode == "clip_cov"
            else "verl kl_cov: the penalty ppo_kl_coef·|log π − log π_old| on the top share of each "
            "micro-batch's tokens by cov(log π, A); no clip"
        )
        clipped = mode == "clip_cov"
        return ActiveRule(mode, low if clipped else None, high if clipped else None, note)
    if mode == "gpg":
        return ActiveRule(None, note="verl gpg: −A·log π with no trust region and no IS weight; no trustlens rule")
    if mode == "cispo":
        return ActiveRule(None, note="verl cispo caps π/π_old (trustlens cispo caps π/μ): not the same rule")
    return ActiveRule(None, note=f"verl loss_mode {mode!r} has no matching trustlens rule")


def verl_cov_fields(actor: Any) -> dict[str, float]:
    """The batch-rule fields (trustlens.rules.batch) of verl's `clip_cov` / `kl_cov` policy loss,
    verl's defaults where the config leaves them unset: {} for every other loss."""
    config = _get(actor, "policy_loss")
    mode = _get(config, "loss_mode", "vanilla")
    if mode == "clip_cov":
        return {
            "cov_ratio": float(_get(config, "clip_cov_ratio", 2e-4)),
            "cov_low": float(_get(config, "clip_cov_lb", 1.0)),
            "cov_high": float(_get(config, "clip_cov_ub", 5.0)),
        }
    if mode == "kl_cov":
        return {
            "cov_ratio": float(_get(config, "kl_cov_ratio", 2e-4)),
            "kl_coef": float(_get(config, "ppo_kl_coef", 1.0)),
        }
    return {}


# verl's rollout_rs levels and the trustlens rule of each: verl ≤ 0.8 bounds π_old/μ; verl 0.9's
# k1 options bound k1 = log(μ/π_old), so that their band [lower, upper] keeps π_old/μ in [1/upper, 1/lower]
_REJECTION_RULES = {"token": "rs_token", "sequence": "rs_seq", "geometric": "rs_geo"}
_K1_RULES = {"token_k1": "rs_token", "seq_sum_k1": "rs_seq", "seq_mean_k1": "rs_geo"}


def _band(spec: Any) -> tuple[float | None, float]:
    """(lower or None, upper) of a verl threshold: a number (the upper bound) or "lower_upper"."""
    if isinstance(spec, str) and "_" in spec:
        lower, upper = spec.split("_", 1)
        return float(lower), float(upper)
    return None, float(spec)


def _rejection_rule(correction: Any) -> ActiveRule | None:
    """The rejection rule of `rollout_rs` with verl's bounds as (low, high) = (1 − lower, upper − 1),
    (None, …) with a note for a level trustlens does not have, None when rejection is off."""
    level = _get(correction, "rollout_rs")
    if level is None:
        return None
    if level not in _REJECTION_RULES and level not in _K1_RULES:
        return ActiveRule(None, note=f"verl rollout_rs {level!r} has no matching trustlens rule")
    lower, upper = _band(_get(correction, "rollout_rs_threshold", 2.0))
    lower = _get(correction, "rollout_rs_threshold_lower", lower)
    lower = 1.0 / upper if lower is None else float(lower)
    if level in _K1_RULES:  # k1 = log(μ/π_old) in [log lower, log upper]: π_old/μ in [1/upper, 1/lower]
        lower, upper = 1.0 / upper, 1.0 / lower
    note = (
        f"verl rollout_rs {level!r}: reject what π_old/μ puts outside [{lower:g}, {upper:g}]; the policy loss's "
        "own clip is recorded as the counterfactual minirl"
    )
    return ActiveRule({**_REJECTION_RULES, **_K1_RULES}[level], 1.0 - lower, upper - 1.0, note)
