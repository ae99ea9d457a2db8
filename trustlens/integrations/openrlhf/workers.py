"""The hooks of OpenRLHF's actors (the training workers): a record per micro-batch of
`ActorPPOTrainer.training_step`, at its `PolicyLoss` call, training passes only. The actor of
data-parallel rank r writes tokens as rank r + 1, under the step and sample ids the driver sent
in each experience's `info` (else its own count of `ppo_train` calls and content ids).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from trustlens.integrations._ray_hooks import (
    SAMPLE_KEY,
    STEP_KEY,
    WorkerRecording,
    external_rules,
    id_list,
    run_dir_from_env,
)
from trustlens.integrations.openrlhf.rules import openrlhf_active_rule
from trustlens.integrations.openrlhf.state import STATE


def experience_sequences(experience: Any) -> tuple[list[torch.Tensor], list[int], torch.Tensor]:
    """Each sample's valid token ids and prompt length, and the responses (B, A)."""
    seqs, mask = experience.sequences, experience.attention_mask.bool()
    width = experience.action_mask.shape[1]
    prompt_lengths = mask[:, :-width].sum(1).tolist()
    return [s[m] for s, m in zip(seqs, mask, strict=True)], prompt_lengths, seqs[:, -width:]


def _buffer_step(buffer: Any) -> int | None:
    """The driver's step sent with the experiences of a replay buffer (the latest, should it hold
    several steps' experiences: OpenRLHF keeps those of the steps its actor is frozen), or None."""
    steps = [item.info.get(STEP_KEY) for item in buffer.items]
    sent = [int(step) for step in steps if step is not None]
    return max(sent) if sent else None


def _worker(trainer: Any) -> WorkerRecording:
    if STATE["worker"] is None:
        dist = torch.distributed
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        rule = openrlhf_active_rule(trainer.actor_loss_fn)
        STATE["worker"] = WorkerRecording(rank + 1, world + 1, external_rules(rule), rule.name)
    return STATE["worker"]


def patch_actor() -> None:
    """Hook the actors' `ActorPPOTrainer.ppo_train` / `training_step` and `PolicyLoss.forward`."""
    from openrlhf.models import PolicyLoss
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    ppo_train, training_step = ActorPPOTrainer.ppo_train, ActorPPOTrainer.training_step
    loss_forward = PolicyLoss.forward

    @functools.wraps(ppo_train)
    def hooked_ppo_train(self, *args, **kwargs):
        if run_dir_from_env():
            _worker(self).begin_step(_buffer_step(self.replay_buffer))
            self._trustlens_calls = 0
        return ppo_train(self, *args, **kwargs)

    @functools.wraps(training_step)
    def hooked_training_step(self, experience, *args, **kwargs):
        # what the driver sent: out of info, which OpenRLHF logs as metrics
        ids = id_list(experience.info.pop(SAMPLE_KEY, None))
        experience.info.pop(STEP_KEY, None)
        if not run_dir_from_env():
            return training_step(self, experience, *args, **kwargs)
        worker = _worker(self)
        calls = getattr(self, "_trustlens_calls", 0)
        while worker.update < calls // max(int(self.strategy.accumulated_gradient), 1):
            worker.next_update()
        self._trustlens_calls = calls + 1
        STATE["ctx"] = (experience, ids)
        try:
            return training_step(self, experience, *args, **kwargs)
        finally:
            STATE["ctx"] = None

    @functools.wraps(loss_forward)
    def hooked_forward(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None, **kw):
        ctx, run_dir = STATE["ctx"], run_dir_from_env()
        if ctx is not None and run_dir and torch.is_grad_enabled():
            experience, ids = ctx
            with torch.no_grad():
                seqs, prompt_lengths, responses = experience_sequences(experience)
                STATE["worker"].record(
                    run_dir,
                    seqs,
                    prompt_lengths,
                    ids=ids,
                    token_ids=responses,
                    response_mask=action_mask,
                    pi_logp=log_probs.detach().float(),
                    old_logp=old_log_probs.detach().float(),
                    mu_logp=None if rollout_log_probs is None else rollout_log_probs.detach().float(),
                    advantages=advantages.detach().float(),
                )
        return loss_forward(self, log_probs, old_log_probs, advantages, action_mask, rollout_log_probs, **kw)

    ActorPPOTrainer.ppo_train = hooked_ppo_train
    ActorPPOTrainer.training_step = hooked_training_step
    PolicyLoss.forward = hooked_forward


__all__ = ["experience_sequences", "patch_actor"]
