"""The hooks of verl's training workers: a record per micro-batch of the policy loss, training
passes only, at `losses.ppo_loss` on verl 0.8–0.9's engine workers (`patch_engine_workers`) and
at `DataParallelPPOActor._forward_micro_batch` inside `update_policy` on verl 0.7's legacy FSDP
workers (`patch_dp_actor`). The worker of data-parallel rank r records as rank r + 1, one rank
per tensor- or sequence-parallel group; what it records is in trustlens.integrations.verl's
docstring. Each row is recorded under the sample id the driver sent with it (`SAMPLE_KEY`), else
its content id (`trustlens.integrations._ray_hooks`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from typing import Any

import torch

from trustlens.integrations._ray_hooks import (
    SAMPLE_KEY,
    STEP_KEY,
    WorkerRecording,
    external_rules,
    id_list,
    padded_sequences,
    run_dir_from_env,
)
from trustlens.integrations.verl.routing import replay_mode, routing_args
from trustlens.integrations.verl.rules import verl_active_rule, verl_cov_fields
from trustlens.integrations.verl.state import STATE


def _worker(actor_config: Any, dp_rank: int, dp_size: int, enabled: bool) -> WorkerRecording | None:
    """This process's WorkerRecording, opened at its first update; None on ranks that do not
    record (all but one rank of each tensor- or sequence-parallel group)."""
    if STATE["worker"] is None:
        rule = verl_active_rule(actor_config)
        recording = WorkerRecording(
            dp_rank + 1, dp_size + 1, external_rules(rule, verl_cov_fields(actor_config)), rule.name
        )
        STATE["worker"] = recording if enabled else False
    return STATE["worker"] or None


def _record_micro_batch(sequences, prompt_lengths, ids, **tensors: Any) -> None:
    run_dir, worker = run_dir_from_env(), STATE["worker"]
    if worker and run_dir:
        tensors = {k: v for k, v in tensors.items() if v is not None}
        worker.record(run_dir, sequences, prompt_lengths, ids=id_list(ids), **tensors)


def _wrap_ppo_loss(ppo_loss):
    """verl ≥ 0.8: record each micro-batch where `losses.ppo_loss` meets model output and data."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    @functools.wraps(ppo_loss)
    def hooked(config, model_output, data, dp_group=None):
        out = ppo_loss(config, model_output, data, dp_group)
        if torch.is_grad_enabled() and run_dir_from_env():
            with torch.no_grad():
                # padded (B, R) as ppo_loss pads them: verl's trainer sends them as nested tensors
                fields = ("response_mask", "old_log_probs", "advantages", "rollout_log_probs")
                padded = data.select(*[k for k in fields if k in data]).to_padded_tensor()
                entropy = model_output.get("entropy")
                seqs, prompt_lengths, responses = _engine_sequences(data, tuple(padded["response_mask"].shape))
                mode = replay_mode(config, bool(tu.get_non_tensor_data(data, "enable_routing_replay", False)))
                _record_micro_batch(
                    seqs,
                    prompt_lengths,
                    data.get(SAMPLE_KEY, None),
                    token_ids=responses,
                    response_mask=padded["response_mask"],
                    pi_logp=no_padding_2_padding(model_output["log_probs"], data).detach().float(),
                    old_logp=padded["old_log_probs"].float(),
                    mu_logp=_float(padded.get("rollout_log_probs", None)),
                    advantages=padded["advantages"].float(),
                    entropy=None if entropy is None else _float(no_padding_2_padding(entropy, data)),
                    **routing_args(data, mode, prompt_lengths, responses.shape[1]),
                )
        return out

    return hooked


def _float(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().float()


def _engine_sequences(data: Any, shape: tuple[int, ...]) -> tuple[list[torch.Tensor], list[int], torch.Tensor]:
    """From an engine micro-batch (no-padding `input_ids`): each sample's valid token ids, its
    prompt length, and the responses padded to `shape` (B, R), the padded response mask's."""
    nested = data["input_ids"]
    offsets = nested.offsets().tolist()
    values = nested.values()
    seqs = [values[a:b] for a, b in itertools.pairwise(offsets)]
    prompts, responses = data["prompts"], data["responses"]
    if prompts.is_nested:
        prompt_lengths = prompts.offsets().diff().tolist()
        responses = responses.to_padded_tensor(0, output_size=shape)
    else:
        prompt_lengths = data["attention_mask"][:, : prompts.shape[1]].sum(1).tolist()
    return seqs, prompt_lengths, responses


def patch_engine_workers() -> None:
    """verl 0.8–0.9: hook `losses.ppo_loss` and the engine `TrainingWorker`'s mini-batch / batch calls."""
    from verl.workers import engine_workers
    from verl.workers.utils import losses

    hooked = _wrap_ppo_loss(losses.ppo_loss)
    losses.ppo_loss = hooked
    engine_workers.ppo_loss = hooked  # engine_workers binds it with functools.partial at init_model
    with contextlib.suppress(ImportError):  # distillation_ppo_loss calls it by this module's name
        from verl.trainer.distillation import losses as distillation_losses

        distillation_losses.ppo_loss = hooked
    worker_cls = engine_workers.TrainingWorker
    mini_batch, train_batch = worker_cls.train_mini_batch, worker_cls.train_batch

    @functools.wraps(mini_batch)
    def train_mini_batch(self, data):
        from verl.utils import tensordict_utils as tu

        loss_fn = getattr(self, "loss_fn", None)  # a partial of (hooked) ppo_loss for the actor
        if run_dir_from_env() and isinstance(loss_fn, functools.partial) and "ppo_loss" in loss_fn.func.__name__:
            engine = self.engine
            worker = _worker(
                loss_fn.keywords.get("config"),
                engine.get_data_parallel_rank(),
                engine.get_data_parallel_size(),
                engine.is_mp_src_rank_with_outputs(),
            )
            if worker is not None:
                worker.begin_step(tu.get(data, key=STEP_KEY, default=None))
        return mini_batch(self, data)

    @functools.wraps(train_batch)
    def train_batch_hooked(self, data):
        out = train_batch(self, data)
        worker = STATE["worker"]
        if worker:
            worker.next_update()
        return out

    worker_cls.train_mini_batch = train_mini_batch
    worker_cls.train_batch = train_batch_hooked


def _keep_sample_ids(data: Any) -> None:
    """Make `data.select` (update_policy keeps only the columns it uses) keep the driver's sample
    ids too, so that they reach the micro-batches."""
    if data.batch is None or SAMPLE_KEY not in data.batch:
        return
    select = data.select

    def select_with_ids(batch_keys=None, *args, **kwargs):
        if batch_keys is not None and SAMPLE_KEY not in batch_keys:
            batch_keys = [*batch_keys, SAMPLE_KEY]
        return select(batch_keys, *args, **kwargs)

    data.select = select_with_ids


def patch_dp_actor() -> None:
    """verl 0.7: hook the legacy `DataParallelPPOActor`'s `update_policy` and `_forward_micro_batch`."""
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    update_policy, forward = DataParallelPPOActor.update_policy, DataParallelPPOActor._forward_micro_batch

    @functools.wraps(update_policy)
    def hooked_update(self, data):
        worker = None
        if run_dir_from_env():
            dist, sp = torch.distributed, int(getattr(self, "ulysses_sequence_parallel_size", 1))
            rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
            worker = _worker(self.config, rank // sp, world // sp, rank % sp == 0)
        if worker is None:
            return update_policy(self, data)
        worker.begin_step(data.meta_info.get(STEP_KEY))
        mini = self.config.ppo_mini_batch_size
        self._trustlens = {"rows": 0, "mini": mini, "on_policy": len(data) <= mini and self.config.ppo_epochs == 1}
        _keep_sample_ids(data)
        try:
            return update_policy(self, data)
        finally:
            worker.next_update()
            del self._trustlens
            data.__dict__.pop("select", None)

    @functools.wraps(forward)
    def hooked_forward(self, micro_batch, temperature, calculate_entropy=False):
        outputs = forward(self, micro_batch, temperature, calculate_entropy)
        ctx = getattr(self, "_trustlens", None)
        if ctx is None or not torch.is_grad_enabled():
            return outputs
        worker = STATE["worker"]
        update = ctx["rows"] // ctx["mini"]
        while worker.update < update:
            worker.next_update()
        ctx["rows"] += len(micro_batch["responses"])
        with torch.no_grad():
            log_prob = outputs["log_probs"].detach().float()
            seqs, prompt_lengths = padded_sequences(
                micro_batch["input_ids"], micro_batch["attention_mask"], micro_batch["responses"].shape[1]
            )
            entropy = outputs.get("entropys") if calculate_entropy else None
            rollout = micro_batch.get("rollout_log_probs")
            _record_micro_batch(
                seqs,
                prompt_lengths,
                micro_batch.get(SAMPLE_KEY),
                token_ids=micro_batch["responses"],
                response_mask=micro_batch["response_mask"],
                pi_logp=log_prob,
                old_logp=log_prob if ctx["on_policy"] else micro_batch["old_log_probs"].float(),
                mu_logp=_float(rollout),
                advantages=micro_batch["advantages"].float(),
                entropy=_float(entropy),
            )
        return outputs

    DataParallelPPOActor.update_policy = hooked_update
    DataParallelPPOActor._forward_micro_batch = hooked_forward
