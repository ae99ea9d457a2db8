"""Record an OpenRLHF (0.11) PPO/GRPO run with trustlens, without forking OpenRLHF.

    TRUSTLENS_DIR=runs/orl python -m trustlens.integrations.openrlhf <train_ppo_ray arguments>

starts Ray with `setup` as every Ray process's `worker_process_setup_hook` (and TRUSTLENS_DIR in
their environment), then runs `openrlhf.cli.train_ppo_ray`. With a Ray cluster you start
yourself, pass the same `runtime_env={"worker_process_setup_hook":
"trustlens.integrations.openrlhf.setup", "env_vars": {"TRUSTLENS_DIR": ...}}` to `ray.init`.

What is recorded, per micro-batch of `ActorPPOTrainer.training_step` (at its `PolicyLoss` call,
training passes only), per action token (`action_mask`):

    token_ids     the response part of `experience.sequences`
    pi_logp       the actor's log-probs of the loss
    old_logp      `experience.action_log_probs`, the π_old OpenRLHF clips against
    mu_logp       `experience.rollout_log_probs` when vLLM returned them, else null
    advantages    `experience.advantages` (B, A)

Entropy is not recorded (OpenRLHF computes it only with an entropy loss). Every rule but the
top-K ones is evaluated counterfactually; OpenRLHF's `ppo` loss clips π/π_old, which is
trustlens' `minirl` (its dual clip and train/rollout IS correction are named in run.json, no rule
blocks the same tokens); its `gspo` loss has no matching rule.

The driver (rank 0) records each step's samples (prompt and response text, reward, mean
advantage, length, from the experience batches) and OpenRLHF's logged numbers as
`openrlhf/<name>`, and marks the run finished, or failed with the error, when `PPOTrainer.fit`
returns. The actor of data-parallel rank r writes tokens as rank r + 1. Steps: the driver's
count of PPO steps on the driver, the count of `ppo_train` calls on a worker (the same, from 1);
`update`: the optimizer step within the step.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
from typing import Any

import torch
from packaging.version import Version

from trustlens.integrations._external import (
    ENV_DIR,
    WorkerRecording,
    closing_run,
    external_rules,
    numeric_metrics,
    run_dir_from_env,
    sample_columns,
    warn_untested,
)
from trustlens.recorder import TokenRecorder

# tests/integrations/test_openrlhf.py passes on 0.11.2
TESTED = (Version("0.11.0"), Version("0.11.2"))
_state: dict[str, Any] = {"patched": False, "worker": None, "driver": None, "step": 0, "ctx": None}


def openrlhf_active_rule(loss: Any) -> tuple[str | None, float | None, float | None, str]:
    """(trustlens rule, low, high, note) for an OpenRLHF `PolicyLoss`."""
    if loss.policy_loss_type != "ppo":
        return None, None, None, f"OpenRLHF {loss.policy_loss_type} loss has no matching trustlens rule"
    note = f"OpenRLHF PPO clips π/π_old to [1 - {loss.clip_eps_low}, 1 + {loss.clip_eps_high}] (trustlens minirl)"
    if loss.dual_clip is not None:
        note += f"; dual clip c = {loss.dual_clip} on A < 0 tokens has no trustlens rule"
    if loss.is_correction_level != "off":
        note += f"; train/rollout IS correction ({loss.is_correction_level}, {loss.is_correction_mode}) is not a rule"
    return "minirl", loss.clip_eps_low, loss.clip_eps_high, note


def _sequences(experience: Any) -> tuple[list[torch.Tensor], list[int], torch.Tensor]:
    """Each sample's valid token ids and prompt length, and the responses (B, A)."""
    seqs, mask = experience.sequences, experience.attention_mask.bool()
    width = experience.action_mask.shape[1]
    prompt_lengths = mask[:, :-width].sum(1).tolist()
    return [s[m] for s, m in zip(seqs, mask, strict=True)], prompt_lengths, seqs[:, -width:]


# ---- the actors ----


def _worker(trainer: Any) -> WorkerRecording:
    if _state["worker"] is None:
        dist = torch.distributed
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        rule, low, high, _ = openrlhf_active_rule(trainer.actor_loss_fn)
        _state["worker"] = WorkerRecording(rank + 1, world + 1, external_rules(rule, low, high), rule)
    return _state["worker"]


def _patch_actor() -> None:
    from openrlhf.models import PolicyLoss
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    ppo_train, training_step = ActorPPOTrainer.ppo_train, ActorPPOTrainer.training_step
    loss_forward = PolicyLoss.forward

    @functools.wraps(ppo_train)
    def hooked_ppo_train(self, *args, **kwargs):
        if run_dir_from_env():
            _worker(self).begin_step(None)
            self._trustlens_calls = 0
        return ppo_train(self, *args, **kwargs)

    @functools.wraps(training_step)
    def hooked_training_step(self, experience, *args, **kwargs):
        if not run_dir_from_env():
            return training_step(self, experience, *args, **kwargs)
        worker = _worker(self)
        calls = getattr(self, "_trustlens_calls", 0)
        while worker.update < calls // max(int(self.strategy.accumulated_gradient), 1):
            worker.next_update()
        self._trustlens_calls = calls + 1
        _state["ctx"] = experience
        try:
            return training_step(self, experience, *args, **kwargs)
        finally:
            _state["ctx"] = None

    @functools.wraps(loss_forward)
    def hooked_forward(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None, **kw):
        experience, run_dir = _state["ctx"], run_dir_from_env()
        if experience is not None and run_dir and torch.is_grad_enabled():
            with torch.no_grad():
                seqs, prompt_lengths, responses = _sequences(experience)
                _state["worker"].record(
                    run_dir,
                    seqs,
                    prompt_lengths,
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


# ---- the driver ----


def _driver(trainer: Any) -> TokenRecorder | None:
    run_dir = run_dir_from_env()
    if run_dir is not None and _state["driver"] is None:
        args = trainer.args
        loss = _policy_loss_of(args)
        rule, low, high, note = openrlhf_active_rule(loss)
        workers = int(args.actor.num_nodes) * int(args.actor.num_gpus_per_node)
        _state["driver"] = TokenRecorder(
            run_dir,
            rules=external_rules(rule, low, high),
            active_rule=rule,
            tokenizer=trainer.tokenizer,
            config={"trainer": "openrlhf", "loss": note, "rank_0": "the OpenRLHF driver"},
            rank=0,
            world_size=workers + 1,
        )
    return _state["driver"]


def _policy_loss_of(args: Any) -> Any:
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


def _log_samples(trainer: Any, experiences: list) -> None:
    recorder = _driver(trainer)
    if recorder is None:
        return
    for exp in experiences:
        seqs, prompt_lengths, responses = _sequences(exp)
        reward = exp.info.get("reward")
        recorder.log_samples(
            _state["step"],
            rewards=None if reward is None else torch.as_tensor(reward, dtype=torch.float32),
            **sample_columns(
                trainer.tokenizer, seqs, prompt_lengths, responses, exp.action_mask.bool(), exp.advantages
            ),
        )


def _patch_driver() -> None:
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer, PPOTrainer

    train_step, save_logs, fit = BasePPOTrainer.train_step, BasePPOTrainer.save_logs_and_checkpoints, PPOTrainer.fit

    @functools.wraps(train_step)
    def hooked_train_step(self, rollout_samples, global_step, *args, **kwargs):
        _state["step"] = int(global_step)
        maker = self.experience_maker
        make = maker.make_experience_batch

        def make_and_log(*a, **k):
            experiences = make(*a, **k)
            _log_samples(self, experiences)
            return experiences

        maker.make_experience_batch = make_and_log
        try:
            return train_step(self, rollout_samples, global_step, *args, **kwargs)
        finally:
            maker.make_experience_batch = make

    @functools.wraps(save_logs)
    def hooked_save_logs(self, global_step, logs_dict=None, *args, **kwargs):
        recorder = _driver(self)
        if recorder is not None and logs_dict:
            recorder.log_metrics(int(global_step), numeric_metrics(logs_dict, "openrlhf/"))
        return save_logs(self, global_step, logs_dict, *args, **kwargs)

    BasePPOTrainer.train_step = hooked_train_step
    BasePPOTrainer.save_logs_and_checkpoints = hooked_save_logs
    PPOTrainer.fit = closing_run(fit, _state)


def setup() -> None:
    """Patch OpenRLHF in this process (idempotent); Ray's `worker_process_setup_hook`."""
    if _state["patched"]:
        return
    from importlib.metadata import version as installed

    version = Version(installed("openrlhf"))
    if version.release[:2] != TESTED[0].release[:2]:
        warn_untested("OpenRLHF", str(version), f"{TESTED[0]}–{TESTED[1]}")
    _state["patched"] = True
    _patch_actor()
    _patch_driver()


def main(argv: list[str] | None = None) -> None:
    """`python -m trustlens.integrations.openrlhf ARGS`: OpenRLHF's train_ppo_ray with the hook."""
    import ray

    from trustlens.integrations import openrlhf as hook  # this module, also when run as __main__

    run_dir = run_dir_from_env()
    if run_dir is None:
        raise SystemExit(f"set {ENV_DIR} to the run directory to record into")
    env = {ENV_DIR: os.path.abspath(run_dir)}
    os.environ[ENV_DIR] = env[ENV_DIR]
    ray.init(runtime_env={"worker_process_setup_hook": "trustlens.integrations.openrlhf.setup", "env_vars": env})
    hook.setup()
    sys.argv = ["train_ppo_ray", *(sys.argv[1:] if argv is None else argv)]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__")


if __name__ == "__main__":
    main()
