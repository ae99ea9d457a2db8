"""The hooks of verl's driver, rank 0 of the run: each step's samples (prompt and response text,
reward, sequence advantage, length) at `_update_actor` of `RayPPOTrainer` and of verl 0.9's
default v1 `PPOTrainer`, every number verl logs through `Tracking.log` (as `verl/<name>`), and
the run's end when `fit` returns (finished, or failed with the error).

Live alerts (trustlens.live): the driver's recorder raises them from what it holds (each step's
samples and verl's logged numbers: reward_drop and grad_norm_spike; the token signals are in the
workers' rows, which `detect_collapse` reads on the run), judges a step when verl logs it, and
adds the alerts so far to verl's own logged metrics as `trustlens/alert/...` (every tracker verl
logs to gets them); TRUSTLENS_STOP_ON stops the run on them (this package's `stop`).

At `_update_actor` the driver numbers the step's samples (`_ray_hooks.sample_ids`) and sends the
workers, with the batch, its global step (`STEP_KEY`: batch-level) and each row's sample id
(`SAMPLE_KEY`: a per-row int64 field, which verl's dispatch splits with the rows).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

from trustlens.integrations._ray_hooks import (
    SAMPLE_KEY,
    STEP_KEY,
    closing_run,
    driver_alerts,
    external_rules,
    numeric_metrics,
    padded_sequences,
    run_dir_from_env,
    sample_columns,
    sample_ids,
)
from trustlens.integrations.verl.rules import verl_active_rule, verl_cov_fields
from trustlens.integrations.verl.sampling import verl_sampling
from trustlens.integrations.verl.state import STATE
from trustlens.integrations.verl.stop import stop_if_due
from trustlens.record import TokenRecorder


def _driver(trainer: Any) -> TokenRecorder | None:
    """The driver's recorder (rank 0: samples, metrics, run.json), opened on first use."""
    run_dir = run_dir_from_env()
    if run_dir is None:
        return None
    if STATE["driver"] is None:
        config = trainer.config
        rule = verl_active_rule(config.actor_rollout_ref.actor, config.get("algorithm"))
        workers = trainer.actor_rollout_wg.world_size
        rollout = config.actor_rollout_ref.get("rollout")  # how μ was made; None: not known
        STATE["driver"] = TokenRecorder(
            run_dir,
            rules=external_rules(rule, verl_cov_fields(config.actor_rollout_ref.actor)),
            active_rule=rule.name,
            tokenizer=trainer.tokenizer,
            config={
                "trainer": "verl",
                "loss": rule.note,
                "verl_version": STATE["version"],
                "rank_0": "the verl driver",
            },
            sampling=None if rollout is None else verl_sampling(rollout),
            rank=0,
            world_size=workers + 1,
            alerts=True,
        )
    return STATE["driver"]


def _log_samples(trainer: Any, batch: Any) -> None:
    recorder = _driver(trainer)
    if recorder is None:
        return
    step = int(trainer.global_steps)
    batch.meta_info[STEP_KEY] = step
    tensors = batch.batch
    responses = tensors["responses"]
    seqs, prompt_lengths = padded_sequences(tensors["input_ids"], tensors["attention_mask"], responses.shape[1])
    ids = sample_ids(seqs, prompt_lengths)
    tensors[SAMPLE_KEY] = torch.tensor(ids[0], dtype=torch.int64, device=responses.device)
    scores = tensors.get("token_level_scores")
    mask = tensors["response_mask"].bool()
    recorder.log_samples(
        step,
        rewards=None if scores is None else scores.sum(-1).float(),
        **sample_columns(trainer.tokenizer, seqs, prompt_lengths, responses, mask, tensors["advantages"], ids),
    )


def _log_samples_v1(trainer: Any, batch: Any) -> None:
    """`_log_samples` for verl ≥ 0.9's v1 trainer, whose batch (a `KVBatchMeta`) names rows kept in
    TransferQueue: the columns are read from there, as nested (per-sample) tensors, and the sample
    ids written back as a field of every row (the batch's field list, when it has one, names it
    too, so that the workers read it). The no-op rows verl appends to make the batch divisible (tag
    `is_padding`, nothing trained) get ids but no samples row."""
    recorder = _driver(trainer)
    if recorder is None:
        return
    import transfer_queue as tq
    from tensordict import TensorDict

    step = int(trainer.global_steps)
    batch.extra_info[STEP_KEY] = step
    fields = ["prompts", "responses", "response_mask", "advantages", "rm_scores"]
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    prompts = list(data["prompts"].unbind())
    padded = data.select("responses", "response_mask", "advantages", "rm_scores").to_padded_tensor()
    responses = padded["responses"]
    mask = padded["response_mask"].bool()
    seqs = [torch.cat([p, r[m]]) for p, r, m in zip(prompts, responses, mask, strict=True)]
    prompt_lengths = [len(p) for p in prompts]
    samples, groups = sample_ids(seqs, prompt_lengths)
    ids = TensorDict({SAMPLE_KEY: torch.tensor(samples, dtype=torch.int64)}, batch_size=len(samples))
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=ids)
    if batch.fields is not None and SAMPLE_KEY not in batch.fields:
        batch.fields = [*batch.fields, SAMPLE_KEY]
    real = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
    keep = torch.tensor(real, dtype=torch.long)
    recorder.log_samples(
        step,
        rewards=padded["rm_scores"][keep].sum(-1).float(),
        **sample_columns(
            trainer.tokenizer,
            [seqs[i] for i in real],
            [prompt_lengths[i] for i in real],
            responses[keep],
            mask[keep],
            padded["advantages"][keep],
            ([samples[i] for i in real], [groups[i] for i in real]),
        ),
    )


def patch_driver() -> None:
    """Hook verl's trainers (`RayPPOTrainer`, verl ≥ 0.9's v1 `PPOTrainer`) and its `Tracking.log`."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.tracking import Tracking

    log = Tracking.log

    def hook_trainer(trainer_cls: Any, log_samples: Any) -> None:
        update_actor = trainer_cls._update_actor

        @functools.wraps(update_actor)
        def hooked_update(self, batch, *args, **kwargs):
            STATE["trainer"] = self  # the trainer whose loop a stop ends
            log_samples(self, batch)
            return update_actor(self, batch, *args, **kwargs)

        trainer_cls._update_actor = hooked_update
        trainer_cls.fit = closing_run(trainer_cls.fit, STATE)

    @functools.wraps(log)
    def hooked_log(self, data, step, *args, **kwargs):
        recorder = STATE["driver"]
        if recorder is not None:
            recorder.log_metrics(int(step), numeric_metrics(data, "verl/"))
            data = driver_alerts(recorder, int(step), data)
            stop_if_due(STATE.get("trainer"), recorder, int(step))
        return log(self, data, step, *args, **kwargs)

    hook_trainer(RayPPOTrainer, _log_samples)
    with contextlib.suppress(ImportError):  # verl ≥ 0.9's default trainer (trainer.use_v1)
        from verl.trainer.ppo.v1.trainer_base import PPOTrainer

        hook_trainer(PPOTrainer, _log_samples_v1)
    Tracking.log = hooked_log
