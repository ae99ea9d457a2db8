"""Record a TRL `GRPOTrainer` (or `DPPOTrainer`) run with trustlens, without forking TRL.

    from trustlens.integrations.trl import TrustLensGRPOTrainer

    trainer = TrustLensGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...),
                                   train_dataset=..., trustlens_dir="runs/grpo")
    trainer.train()            # writes runs/grpo: tokens, samples, metrics, run.json

`with_trustlens(cls)` does the same for any subclass of `GRPOTrainer`, e.g. TRL's DPPO trainer:
`with_trustlens(trl.experimental.dppo.DPPOTrainer)`. Instead of
`trustlens_dir`, an open recorder may be passed as `recorder=` (its owner closes it). Without
vLLM, `rollout_func=engine_rollout("bf16")` samples with a bf16 copy of the policy and hands TRL
the sampling log-probabilities, so that the run records μ and a real training–inference mismatch.

What the hook records, per micro-batch of TRL's loss (`_compute_loss`):

    token_ids, response mask   completion_ids; completion_mask × tool_mask (the tokens TRL trains on)
    pi_logp, entropy           TRL's own log-prob pass of the loss, captured, not recomputed
                               (TRL divides the logits by its sampling temperature, as μ needs)
    old_logp                   `old_per_token_logps` when TRL recomputes π_old; when it does not
                               (generation and optimizer steps aligned), TRL trains with
                               π_old = π, and that is what is recorded
    mu_logp                    `sampling_per_token_logps`: vLLM's, or a `rollout_func`'s
                               "logprobs" (at TRL's temperature). Without them μ is null and
                               every μ-anchored rule is evaluated on π_old (run.json says so).
                               Sequences holding a token vLLM could not score are recorded
                               with null μ.
    advantages                 TRL's advantages, (B,) or (B, T)

and per generation the samples (prompt and completion text, reward = the weighted sum of the
reward functions as TRL logs it, advantage, length). Every value TRL logs (reward, loss, entropy,
clip ratios, ...; through a TrainerCallback) goes into the metrics table: main process only, one
row per (step, name) averaged over the logging calls of that step, names prefixed ``trl/``.

Every rule that needs no top-K is evaluated counterfactually on every token. The active rule is
TRL's loss: `minirl` (ratio clipping against π_old) with TRL's ε_low / ε_high for GRPOTrainer's
clipped losses, `cispo` for CISPO, none for the others; for a `DPPOTrainer` (TRL ≥ 1.8,
`trl.experimental.dppo`) `dppo_<divergence_type>` anchored on μ with thresholds (ε, ε_high), as
TRL's divergence mask decides. A top-K DPPO run keeps π's log-probs on μ's top-K ids: the hook
captures them and records `topk_tv` / `topk_kl` from them (`topk_divergence_from_logp`), so the
top-K rules are evaluated too, when the recorder accepts precomputed top-K divergences.

Live alerts (trustlens.live): `stop_on="critical"` (or "warning") makes the recorder the hook
opens raise the collapse alerts and doctor findings live, and attaches a `TrustLensCallback`
that stops training on the first at that severity: it sets `control.should_save`
(OUTPUT_DIR/checkpoint-<step>) and `control.should_training_stop`, and run.json's `stopped` says
why. With a recorder of your own (`recorder=`, opened with `alerts=`), attach the callback
yourself: `callbacks=[TrustLensCallback(recorder, stop_on="critical")]`. `on_alert=callable` gets
each alert of warning or above on a trustlens thread.

Steps: trustlens `step` = one TRL generation (a rollout batch, reused for
`steps_per_generation × num_iterations` micro-batches); `update` = optimizer steps taken since
that generation (for a configuration that accumulates more micro-batches than one generation
holds, the pass over the generation batch), so (step, update, sample, pos) stays unique. Sample
ids are unique within the run across ranks; samples of one prompt share a group id.

TRL's private methods change between releases: `with_trustlens` checks at class creation that
the ones the hook wraps exist, the hook takes extra arguments through, and it raises
`UnsupportedTRLVersion`, naming the installed version, when something it relies on is missing.

Every name is importable from here; the code is in this package's `hook` (the hook,
`TrustLensGRPOMixin`), `compat` (the checks of the installed TRL), `rules` (the rules a TRL loss
maps to), `sampling` (run.json's `sampling`), `rollout` (`engine_rollout`) and `stop`
(`TrustLensCallback`).
"""

from __future__ import annotations

from trustlens.integrations.trl.compat import MAX_TESTED_TRL, MIN_TRL, UnsupportedTRLVersion, check_trl, trl
from trustlens.integrations.trl.hook import GROUP_KEY, SAMPLE_KEY, TrustLensGRPOMixin
from trustlens.integrations.trl.rollout import engine_rollout
from trustlens.integrations.trl.rules import Thresholds, active_rule_of, default_rules
from trustlens.integrations.trl.sampling import trl_sampling
from trustlens.integrations.trl.stop import TrustLensCallback

__all__ = [
    "GROUP_KEY",
    "MAX_TESTED_TRL",
    "MIN_TRL",
    "SAMPLE_KEY",
    "Thresholds",
    "TrustLensCallback",
    "TrustLensGRPOMixin",
    "TrustLensGRPOTrainer",
    "UnsupportedTRLVersion",
    "active_rule_of",
    "check_trl",
    "default_rules",
    "engine_rollout",
    "trl_sampling",
    "with_trustlens",
]


_CLASSES: dict[type, type] = {}


def with_trustlens(trainer_cls: type = trl.GRPOTrainer) -> type:
    """`trainer_cls` (GRPOTrainer or a subclass) with the trustlens hook: the returned class takes
    `trustlens_dir=` (or `recorder=`) and `rules=` on top of `trainer_cls`'s arguments.

    Raises UnsupportedTRLVersion when the installed TRL lacks a method the hook wraps.
    """
    if trainer_cls not in _CLASSES:
        check_trl(trainer_cls)
        _CLASSES[trainer_cls] = type(
            f"TrustLens{trainer_cls.__name__}",
            (TrustLensGRPOMixin, trainer_cls),
            {
                "__doc__": f"{trainer_cls.__name__} recording every trained token with trustlens.",
                "_tl_base": trainer_cls,
            },
        )
    return _CLASSES[trainer_cls]


TrustLensGRPOTrainer = with_trustlens(trl.GRPOTrainer)
