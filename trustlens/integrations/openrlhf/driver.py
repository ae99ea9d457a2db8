"""The hooks of OpenRLHF's driver, rank 0 of the run: each step's samples (prompt and response
text, reward, mean advantage, length, from the experience batches) at `BasePPOTrainer.train_step`,
OpenRLHF's logged numbers as `openrlhf/<name>` (with the live alerts so far as
`trustlens/alert/...`) at `save_logs_and_checkpoints`, and the run's end when `fit` returns
(finished, or failed with the error).

PPOTrainer is a Ray actor class: Ray copies its methods when the class is decorated and ships that
copy to the actor's process, so `patch_driver` patches the copy (`__ray_metadata__.modified_class`)
as well as OpenRLHF's classes, with module-level functions that pickle by reference.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch

from trustlens.integrations._ray_hooks import (
    SAMPLE_KEY,
    STEP_KEY,
    closing_run,
    driver_alerts,
    external_rules,
    finishing,
    numeric_metrics,
    run_dir_from_env,
    sample_columns,
    sample_ids,
)
from trustlens.integrations.openrlhf.rules import openrlhf_active_rule, policy_loss_of
from trustlens.integrations.openrlhf.sampling import openrlhf_sampling
from trustlens.integrations.openrlhf.state import ORIGINALS, STATE
from trustlens.integrations.openrlhf.workers import experience_sequences
from trustlens.record import TokenRecorder


def _driver(trainer: Any) -> TokenRecorder | None:
    run_dir = run_dir_from_env()
    if run_dir is not None and STATE["driver"] is None:
        args = trainer.args
        rule = openrlhf_active_rule(policy_loss_of(args))
        workers = int(args.actor.num_nodes) * int(args.actor.num_gpus_per_node)
        STATE["driver"] = TokenRecorder(
            run_dir,
            rules=external_rules(rule),
            active_rule=rule.name,
            tokenizer=trainer.tokenizer,
            config={"trainer": "openrlhf", "loss": rule.note, "rank_0": "the OpenRLHF driver"},
            sampling=openrlhf_sampling(getattr(trainer, "generate_kwargs", None) or {}),
            rank=0,
            world_size=workers + 1,
            alerts=True,
        )
    return STATE["driver"]


def _log_samples(trainer: Any, experiences: list, step: int) -> None:
    """Record the samples of one step's experiences and give each experience, in `info`, the step
    and its samples' ids (numbered over all the experiences), for the actors."""
    recorder = _driver(trainer)
    if recorder is None:
        return
    parts = [experience_sequences(exp) for exp in experiences]
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
    return ORIGINALS[name]


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
    return finishing(STATE, _original(self, "fit"), self, *args, **kwargs)


_HOOKS = (_train_step, _save_logs, _fit)


def patch_driver() -> None:
    """Hook `BasePPOTrainer`'s train_step / save_logs_and_checkpoints and the trainers' fit (in
    the copy Ray ships of a Ray actor class too)."""
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer, PPOTrainer

    hooks = {"train_step": _train_step, "save_logs_and_checkpoints": _save_logs}
    for name, hook in hooks.items():
        ORIGINALS[name] = getattr(BasePPOTrainer, name)
        setattr(BasePPOTrainer, name, hook)
    trainers = [PPOTrainer]
    with contextlib.suppress(ImportError):  # OpenRLHF's asynchronous trainer (--train.async_enable)
        from openrlhf.trainer.ppo_trainer_async import TrainingActor

        trainers.append(TrainingActor)
    for trainer in trainers:
        shipped = getattr(getattr(trainer, "__ray_metadata__", None), "modified_class", None)
        if shipped is None:  # not a Ray actor class
            trainer.fit = closing_run(trainer.fit, STATE)
            continue
        for name, hook in {**hooks, "fit": _fit}.items():
            setattr(shipped, name, hook)


__all__ = ["patch_driver"]
