"""The hooks of verl's driver, rank 0 of the run: each step's samples (prompt and response text,
reward, sequence advantage, length) at `_update_actor` of `RayPPOTrainer` and of verl 0.9's
default v1 `PPOTrainer`, every number verl logs through `Tracking.log` (as `verl/<name>`), and
the run's end when `fit` returns (finished, or failed with the error).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

from trustlens.integrations._external import (
    closing_run,
    external_rules,
    numeric_metrics,
    padded_sequences,
    run_dir_from_env,
    sample_columns,
)
from trustlens.integrations._verl_compat import _verl_version
from trustlens.integrations._verl_rules import verl_active_rule
from trustlens.integrations._verl_state import _STEP_KEY, _state
from trustlens.recorder import TokenRecorder


def _driver(trainer: Any) -> TokenRecorder | None:
    """The driver's recorder (rank 0: samples, metrics, run.json), opened on first use."""
    run_dir = run_dir_from_env()
    if run_dir is None:
        return None
    if _state["driver"] is None:
        config = trainer.config
        rule, low, high, note = verl_active_rule(config.actor_rollout_ref.actor, config.get("algorithm"))
        workers = trainer.actor_rollout_wg.world_size
        _state["driver"] = TokenRecorder(
            run_dir,
            rules=external_rules(rule, low, high),
            active_rule=rule,
            tokenizer=trainer.tokenizer,
            config={"trainer": "verl", "loss": note, "verl_version": _verl_version(), "rank_0": "the verl driver"},
            rank=0,
            world_size=workers + 1,
        )
    return _state["driver"]


def _log_samples(trainer: Any, batch: Any) -> None:
    recorder = _driver(trainer)
    if recorder is None:
        return
    step = int(trainer.global_steps)
    batch.meta_info[_STEP_KEY] = step
    tensors = batch.batch
    responses = tensors["responses"]
    seqs, prompt_lengths = padded_sequences(tensors["input_ids"], tensors["attention_mask"], responses.shape[1])
    scores = tensors.get("token_level_scores")
    recorder.log_samples(
        step,
        rewards=None if scores is None else scores.sum(-1).float(),
        **sample_columns(
            trainer.tokenizer, seqs, prompt_lengths, responses, tensors["response_mask"].bool(), tensors["advantages"]
        ),
    )


def _log_samples_v1(trainer: Any, batch: Any) -> None:
    """`_log_samples` for verl ≥ 0.9's v1 trainer, whose batch (a `KVBatchMeta`) names rows kept in
    TransferQueue: the columns are read from there, as nested (per-sample) tensors. The no-op rows
    verl appends to make the batch divisible (tag `is_padding`, nothing trained) are left out."""
    recorder = _driver(trainer)
    if recorder is None:
        return
    import transfer_queue as tq

    step = int(trainer.global_steps)
    batch.extra_info[_STEP_KEY] = step
    fields = ["prompts", "responses", "response_mask", "advantages", "rm_scores"]
    keys = [k for k, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get("is_padding", False)]
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=fields)
    prompts = list(data["prompts"].unbind())
    padded = data.select("responses", "response_mask", "advantages", "rm_scores").to_padded_tensor()
    responses = padded["responses"]
    mask = padded["response_mask"].bool()
    seqs = [torch.cat([p, r[m]]) for p, r, m in zip(prompts, responses, mask, strict=True)]
    recorder.log_samples(
        step,
        rewards=padded["rm_scores"].sum(-1).float(),
        **sample_columns(trainer.tokenizer, seqs, [len(p) for p in prompts], responses, mask, padded["advantages"]),
    )


def _patch_driver() -> None:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.tracking import Tracking

    log = Tracking.log

    def hook_trainer(trainer_cls: Any, log_samples: Any) -> None:
        update_actor = trainer_cls._update_actor

        @functools.wraps(update_actor)
        def hooked_update(self, batch, *args, **kwargs):
            log_samples(self, batch)
            return update_actor(self, batch, *args, **kwargs)

        trainer_cls._update_actor = hooked_update
        trainer_cls.fit = closing_run(trainer_cls.fit, _state)

    @functools.wraps(log)
    def hooked_log(self, data, step, *args, **kwargs):
        if _state["driver"] is not None:
            _state["driver"].log_metrics(int(step), numeric_metrics(data, "verl/"))
        return log(self, data, step, *args, **kwargs)

    hook_trainer(RayPPOTrainer, _log_samples)
    with contextlib.suppress(ImportError):  # verl ≥ 0.9's default trainer (trainer.use_v1)
        from verl.trainer.ppo.v1.trainer_base import PPOTrainer

        hook_trainer(PPOTrainer, _log_samples_v1)
    Tracking.log = hooked_log
