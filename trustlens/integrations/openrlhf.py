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

Live alerts (trustlens.live): the driver's recorder raises them from what it holds (samples and
OpenRLHF's logged numbers) and adds the alerts so far to the numbers OpenRLHF logs as
`trustlens/alert/...` (its W&B and TensorBoard loggers get them); how to stop on them:
docs/attach.md.

The driver (rank 0) records each step's samples (prompt and response text, reward, mean
advantage, length, from the experience batches) and OpenRLHF's logged numbers as
`openrlhf/<name>`, and marks the run finished, or failed with the error, when `PPOTrainer.fit`
returns. The actor of data-parallel rank r writes tokens as rank r + 1.

Steps: the step OpenRLHF's `fit` logs. `fit` calls `train_step(samples, global_step)` and then
`save_logs_and_checkpoints(global_step + 1)`, so the samples of that call and the tokens trained
on them are recorded at global_step + 1, as the metrics and checkpoint (`global_step<N>`) are, and
a run resumed from a checkpoint goes on from there. The driver sends the step to the actors with
the experiences (`info["trustlens_step"]`), with each sample's id (`info["trustlens_sample"]`,
numbered over all the step's experiences: `trustlens.integrations._external`); the actor takes
both out of `info` (OpenRLHF would log them as metrics) and records its rows under them. An
actor whose experiences came without them counts its `ppo_train` calls from 1 and uses content
ids. `update`: the optimizer step within the step.

PPOTrainer is a Ray actor class: Ray copies its methods when the class is decorated and ships that
copy to the actor's process, so `setup` patches the copy (`__ray_metadata__.modified_class`) as
well as OpenRLHF's classes, with module-level functions that pickle by reference; the process that
creates the trainer (the launcher, or your driver script) must have called `setup` first.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import runpy
import sys
from typing import Any

import torch
from packaging.version import Version

from trustlens.integrations._external import (
    ENV_DIR,
    SAMPLE_KEY,
    STEP_KEY,
    WorkerRecording,
    closing_run,
    driver_alerts,
    external_rules,
    finishing,
    id_list,
    numeric_metrics,
    run_dir_from_env,
    sample_columns,
    sample_ids,
    warn_untested,
)
from trustlens.integrations.engines_sampling import openrlhf_sampling
from trustlens.record import TokenRecorder

# tests/integrations/test_openrlhf.py passes on 0.11.2
TESTED = (Version("0.11.0"), Version("0.11.2"))
_state: dict[str, Any] = {"patched": False, "worker": None, "driver": None, "ctx": None}
# the BasePPOTrainer methods setup replaced in this process, by name
_originals: dict[str, Any] = {}


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


def _buffer_step(buffer: Any) -> int | None:
    """The driver's step sent with the experiences of a replay buffer (the latest, should it hold
    several steps' experiences: OpenRLHF keeps those of the steps its actor is frozen), or None."""
    steps = [item.info.get(STEP_KEY) for item in buffer.items]
    sent = [int(step) for step in steps if step is not None]
    return max(sent) if sent else None


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
        _state["ctx"] = (experience, ids)
        try:
            return training_step(self, experience, *args, **kwargs)
        finally:
            _state["ctx"] = None

    @functools.wraps(loss_forward)
    def hooked_forward(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None, **kw):
        ctx, run_dir = _state["ctx"], run_dir_from_env()
        if ctx is not None and run_dir and torch.is_grad_enabled():
            experience, ids = ctx
            with torch.no_grad():
                seqs, prompt_lengths, responses = _sequences(experience)
                _state["worker"].record(
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
            sampling=openrlhf_sampling(getattr(trainer, "generate_kwargs", None) or {}),
            rank=0,
            world_size=workers + 1,
            alerts=True,
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


def _log_samples(trainer: Any, experiences: list, step: int) -> None:
    """Record the samples of one step's experiences and give each experience, in `info`, the step
    and its samples' ids (numbered over all the experiences), for the actors."""
    recorder = _driver(trainer)
    if recorder is None:
        return
    parts = [_sequences(exp) for exp in experiences]
    samples, groups = sample_ids(
        [seq for seqs, _, _ in parts for seq in seqs], [n for _, lengths, _ in parts for n in lengths]
    )
    start = 0
    for exp, (seqs, prompt_lengths, responses) in zip(experiences, parts, strict=True):
        ids = samples[start : start + len(seqs)], groups[start : start + len(seqs)]
        start += len(seqs)
        exp.info[SAMPLE_KEY] = torch.tensor(ids[0], dtype=torch.int64)
        exp.info[STEP_KEY] = torch.full((len(seqs),), step, dtype=torch.int64)
        reward = exp.info.get("reward")
        recorder.log_samples(
            step,
            rewards=None if reward is None else torch.as_tensor(reward, dtype=torch.float32),
            **sample_columns(
                trainer.tokenizer, seqs, prompt_lengths, responses, exp.action_mask.bool(), exp.advantages, ids
            ),
        )


def _original(trainer: Any, name: str) -> Any:
    """The OpenRLHF method `name` that trustlens' hook of `trainer`'s class stands in for: the first
    definition in its class hierarchy that is not a hook (behind Ray's own wrapper, in a class
    Ray shipped), else the one `setup` replaced in this process."""
    for klass in type(trainer).__mro__:
        method = klass.__dict__.get(name)
        if method is not None and inspect.unwrap(method) not in _HOOKS:
            return method
    return _originals[name]


def _train_step(self: Any, rollout_samples: Any, global_step: int, *args: Any, **kwargs: Any) -> Any:
    """BasePPOTrainer.train_step, recording the samples of the experiences it makes at the step
    `fit` logs this training step under (global_step + 1) and sending the actors that step and
    the samples' ids with the experiences."""
    train_step = _original(self, "train_step")
    if _driver(self) is None:
        return train_step(self, rollout_samples, global_step, *args, **kwargs)
    step = int(global_step) + 1
    maker = self.experience_maker
    make = maker.make_experience_batch

    def make_and_log(*a, **k):
        experiences = make(*a, **k)
        _log_samples(self, experiences, step)
        return experiences

    maker.make_experience_batch = make_and_log
    try:
        return train_step(self, rollout_samples, global_step, *args, **kwargs)
    finally:
        maker.make_experience_batch = make


def _save_logs(self: Any, global_step: int, logs_dict: Any = None, *args: Any, **kwargs: Any) -> Any:
    """BasePPOTrainer.save_logs_and_checkpoints, recording the numbers OpenRLHF logs."""
    recorder = _driver(self)
    if recorder is not None and logs_dict:
        recorder.log_metrics(int(global_step), numeric_metrics(logs_dict, "openrlhf/"))
    if recorder is not None:
        logs_dict = driver_alerts(recorder, int(global_step), dict(logs_dict or {}))
    return _original(self, "save_logs_and_checkpoints")(self, global_step, logs_dict, *args, **kwargs)


def _fit(self: Any, *args: Any, **kwargs: Any) -> Any:
    """The trainer's fit, marking the run finished when it returns and failed when it raises."""
    return finishing(_state, _original(self, "fit"), self, *args, **kwargs)


_HOOKS = (_train_step, _save_logs, _fit)


def _patch_driver() -> None:
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer, PPOTrainer

    hooks = {"train_step": _train_step, "save_logs_and_checkpoints": _save_logs}
    for name, hook in hooks.items():
        _originals[name] = getattr(BasePPOTrainer, name)
        setattr(BasePPOTrainer, name, hook)
    trainers = [PPOTrainer]
    with contextlib.suppress(ImportError):  # OpenRLHF's asynchronous trainer (--train.async_enable)
        from openrlhf.trainer.ppo_trainer_async import TrainingActor

        trainers.append(TrainingActor)
    for trainer in trainers:
        shipped = getattr(getattr(trainer, "__ray_metadata__", None), "modified_class", None)
        if shipped is None:  # not a Ray actor class
            trainer.fit = closing_run(trainer.fit, _state)
            continue
        for name, hook in {**hooks, "fit": _fit}.items():
            setattr(shipped, name, hook)


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


def _is_url(path: str) -> bool:
    """Whether `path` is a URL ("scheme://…", such as s3://bucket/run) rather than a local path."""
    return re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", path) is not None


def main(argv: list[str] | None = None) -> None:
    """`python -m trustlens.integrations.openrlhf ARGS`: OpenRLHF's train_ppo_ray with the hook."""
    run_dir = run_dir_from_env()
    if run_dir is None:
        raise SystemExit(f"set {ENV_DIR} to the run directory to record into")
    import ray

    from trustlens.integrations import openrlhf as hook  # this module, also when run as __main__

    env = {ENV_DIR: run_dir if _is_url(run_dir) else os.path.abspath(run_dir)}
    os.environ[ENV_DIR] = env[ENV_DIR]
    ray.init(runtime_env={"worker_process_setup_hook": "trustlens.integrations.openrlhf.setup", "env_vars": env})
    hook.setup()
    sys.argv = ["train_ppo_ray", *(sys.argv[1:] if argv is None else argv)]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__")


if __name__ == "__main__":
    main()
