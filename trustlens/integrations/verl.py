"""Record a verl PPO/GRPO run with trustlens by configuration alone, without forking verl.

    TRUSTLENS_DIR=runs/verl python -m verl.trainer.main_ppo ... \\
        actor_rollout_ref.model.external_lib=trustlens.integrations.verl \\
        +ray_kwargs.ray_init.runtime_env.env_vars.TRUSTLENS_DIR=runs/verl \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=trustlens.integrations.verl.setup

verl imports `external_lib` in every training worker (verl 0.9 in its driver, the TaskRunner,
too); Ray's `worker_process_setup_hook` runs `setup` in every Ray process, the driver included.
Importing this module (or calling `setup`) patches verl in that process, once; with TRUSTLENS_DIR
unset nothing is recorded.

Where the tensors meet (one hook per micro-batch of the policy loss, training passes only: passes
without gradient, such as verl's log-prob recomputation, record nothing):

    verl 0.8-0.9 (engine workers)  verl.workers.utils.losses.ppo_loss
    verl 0.7 (legacy FSDP workers) DataParallelPPOActor._forward_micro_batch inside update_policy

What is recorded, per response token verl trains on (response_mask):

    token_ids     `responses`
    pi_logp       the loss's own log π (verl's forward at its rollout temperature)
    old_logp      `old_log_probs`, the π_old verl clips against (verl 0.7 on-policy: π itself,
                  as verl uses it)
    mu_logp       `rollout_log_probs` when the rollout engine returned them, else null (the run's
                  μ-anchored rules are then evaluated on π_old, and run.json says "anchor": "old")
    advantages    `advantages` (B, T); entropy when verl computes it

Every rule but the top-K ones is evaluated counterfactually. verl's loss is mapped to the rule
that blocks the same tokens (`verl_active_rule`); where none does, run.json says so instead of
naming a wrong rule. The driver (`_update_actor` and `fit` of `RayPPOTrainer` and of verl 0.9's
default v1 `PPOTrainer`) records each step's samples (prompt and response text, reward, sequence
advantage, length) and every number verl logs (as `verl/<name>`), and marks the run finished, or
failed with the error, when `fit` returns.

Ranks: rank 0 is the driver; the worker of verl data-parallel rank r writes tokens as rank r + 1
(one rank per tensor- or sequence-parallel group records: verl's model-parallel source rank).
Tested on verl 0.9.1 (`main_ppo` end to end, and engine workers) and 0.7.1 (legacy workers);
docs/attach.md says how.
Steps: verl's global step (sent by the driver with the batch), else the count of the worker's
update calls. `update`: the mini-batch update within the step. Sample ids:
`trustlens.integrations._external`.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import warnings
from typing import Any

import torch
from packaging.version import Version

from trustlens.integrations._external import (
    WorkerRecording,
    closing_run,
    external_rules,
    numeric_metrics,
    padded_sequences,
    run_dir_from_env,
    sample_columns,
    warn_untested,
)
from trustlens.recorder import TokenRecorder

MIN_VERL = Version("0.7.0")
# tests/integrations/test_verl.py passes on verl 0.7.1 and 0.9.1
MAX_TESTED_VERL = Version("0.9.1")
_STEP_KEY = "trustlens_step"  # the driver's global step, sent to the workers with the batch
_state: dict[str, Any] = {"patched": False, "worker": None, "driver": None}


class UnsupportedVerlVersion(RuntimeError):
    """The installed verl is older than this integration supports, or lacks a hooked function."""


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


def _check_version() -> None:
    import verl

    version = Version(verl.__version__)
    if version < MIN_VERL:
        raise UnsupportedVerlVersion(f"trustlens.integrations.verl needs verl >= {MIN_VERL}, found {version}")
    if version.release[:2] > MAX_TESTED_VERL.release[:2]:
        warn_untested("verl", str(version), f"{MIN_VERL}–{MAX_TESTED_VERL}")


# ---- the workers ----


def _worker(actor_config: Any, dp_rank: int, dp_size: int, enabled: bool) -> WorkerRecording | None:
    """This process's WorkerRecording, opened at its first update; None on ranks that do not
    record (all but one rank of each tensor- or sequence-parallel group)."""
    if _state["worker"] is None:
        rule, low, high, _ = verl_active_rule(actor_config)
        recording = WorkerRecording(dp_rank + 1, dp_size + 1, external_rules(rule, low, high), rule)
        _state["worker"] = recording if enabled else False
    return _state["worker"] or None


def _record_micro_batch(sequences, prompt_lengths, **tensors: Any) -> None:
    run_dir, worker = run_dir_from_env(), _state["worker"]
    if worker and run_dir:
        worker.record(run_dir, sequences, prompt_lengths, **{k: v for k, v in tensors.items() if v is not None})


def _wrap_ppo_loss(ppo_loss):
    """verl ≥ 0.8: record each micro-batch where `losses.ppo_loss` meets model output and data."""
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
                _record_micro_batch(
                    seqs,
                    prompt_lengths,
                    token_ids=responses,
                    response_mask=padded["response_mask"],
                    pi_logp=no_padding_2_padding(model_output["log_probs"], data).detach().float(),
                    old_logp=padded["old_log_probs"].float(),
                    mu_logp=_float(padded.get("rollout_log_probs", None)),
                    advantages=padded["advantages"].float(),
                    entropy=None if entropy is None else _float(no_padding_2_padding(entropy, data)),
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


def _patch_engine_workers() -> None:
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
                worker.begin_step(tu.get(data, key=_STEP_KEY, default=None))
        return mini_batch(self, data)

    @functools.wraps(train_batch)
    def train_batch_hooked(self, data):
        out = train_batch(self, data)
        worker = _state["worker"]
        if worker:
            worker.next_update()
        return out

    worker_cls.train_mini_batch = train_mini_batch
    worker_cls.train_batch = train_batch_hooked


def _patch_dp_actor() -> None:
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
        worker.begin_step(data.meta_info.get(_STEP_KEY))
        mini = self.config.ppo_mini_batch_size
        self._trustlens = {"rows": 0, "mini": mini, "on_policy": len(data) <= mini and self.config.ppo_epochs == 1}
        try:
            return update_policy(self, data)
        finally:
            worker.next_update()
            del self._trustlens

    @functools.wraps(forward)
    def hooked_forward(self, micro_batch, temperature, calculate_entropy=False):
        outputs = forward(self, micro_batch, temperature, calculate_entropy)
        ctx = getattr(self, "_trustlens", None)
        if ctx is None or not torch.is_grad_enabled():
            return outputs
        worker = _state["worker"]
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


# ---- the driver ----


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


def _verl_version() -> str:
    import verl

    return str(verl.__version__)


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


def setup() -> None:
    """Patch verl in this process (idempotent): the training workers' loss and the driver's
    trainer. Called on import; also usable as Ray's `worker_process_setup_hook`."""
    if _state["patched"]:
        return
    _check_version()
    _state["patched"] = True
    try:
        with contextlib.suppress(ImportError):  # a verl without engine workers
            _patch_engine_workers()
        with contextlib.suppress(ImportError):  # verl 0.9 has no legacy dp_actor
            _patch_dp_actor()
    except AttributeError as err:  # a function the hook wraps is gone
        raise UnsupportedVerlVersion(f"verl {_verl_version()} lacks what trustlens hooks: {err}") from err
    try:
        _patch_driver()
    except ImportError as err:
        warnings.warn(f"trustlens: verl's trainer could not be hooked ({err}); samples are not recorded", stacklevel=2)


setup()
