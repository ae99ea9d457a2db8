"""The recording hook of trustlens.integrations.trl: `TrustLensGRPOMixin`, combined with a TRL
trainer class by `with_trustlens`. What it records, and how TRL's generations and micro-batches
map to trustlens steps and updates, is in trustlens.integrations.trl's docstring; its live-alert
stop is a `TrustLensCallback` (trustlens.integrations.trl.stop).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import trl
from transformers import TrainerCallback

from trustlens.integrations.trl.compat import BATCH_KEYS, unsupported
from trustlens.integrations.trl.rules import active_rule_of, default_rules
from trustlens.integrations.trl.sampling import trl_sampling
from trustlens.integrations.trl.stop import TrustLensCallback, planned_generations
from trustlens.live.stop import stop_level
from trustlens.live.tap import check_on_alert
from trustlens.rules import resolve_rules

# keys the hook adds to TRL's batch dict: they are shuffled and split with the batch
SAMPLE_KEY = "trustlens_sample"
GROUP_KEY = "trustlens_group"

# The mixin is only ever combined with GRPOTrainer (or a subclass), whose attributes it uses and
# whose methods it extends: typed as Any, so the type checker takes them as given.
_MixinBase: Any = object


class TrustLensGRPOMixin(_MixinBase):
    """The recording hook; use it through `with_trustlens` / `TrustLensGRPOTrainer`."""

    _tl_base: type  # the TRL trainer class it is combined with (set by `with_trustlens`)

    def __init__(
        self,
        *args: Any,
        trustlens_dir: str | Path | None = None,
        recorder: Any = None,
        rules: Any = None,
        stop_on: str = "never",
        on_alert: Any = None,
        **kwargs: Any,
    ) -> None:
        if (trustlens_dir is None) == (recorder is None):
            raise ValueError(
                f"{type(self).__name__}: pass exactly one of trustlens_dir= (a new run directory) "
                "or recorder= (an open TokenRecorder)"
            )
        stop_level(stop_on)  # a bad stop_on / on_alert is refused before TRL sets up
        self._tl_on_alert = check_on_alert(on_alert)
        self._tl_alerts = stop_on != "never" or on_alert is not None  # the recorder it opens raises live alerts
        super().__init__(*args, **kwargs)
        if getattr(self.args, "use_liger_loss", False) or (
            getattr(self, "use_liger_kernel", False) and hasattr(self, "compute_liger_loss")
        ):
            raise unsupported("the Liger GRPO loss bypasses _compute_loss; set use_liger_kernel=False")
        self._tl_owns_recorder = recorder is None
        if recorder is None:
            assert trustlens_dir is not None  # exactly one of the two was given
            recorder = self._tl_open_recorder(trustlens_dir, rules)
        self.trustlens_recorder = recorder
        self._tl_step = -1  # trustlens step of the current generation (-1: none yet)
        self._tl_micro = 0  # micro-batches consumed since that generation
        self._tl_samples_seen = 0  # samples generated so far, all ranks
        self._tl_capture: list | None = None  # log-prob passes seen inside _compute_loss
        self._tl_rewards: torch.Tensor | None = None  # (N_all_ranks, n_funcs) of the last scoring
        self._tl_pending: dict[str, list[float]] = defaultdict(list)  # TRL logs of the current step
        self.add_callback(_LogCallback(self))
        self._tl_bind_stops(stop_on)

    # ---- setup ----

    def _tl_bind_stops(self, stop_on: str) -> None:
        """Attach a TrustLensCallback for `stop_on` (unless "never") and give every TrustLensCallback
        the run's trustlens step; one given another recorder than the trainer's is refused."""
        stops = [c for c in self.callback_handler.callbacks if isinstance(c, TrustLensCallback)]
        if stop_on != "never":
            if stops:
                raise ValueError(f"{type(self).__name__}: pass stop_on= or a TrustLensCallback in callbacks=, not both")
            stops = [TrustLensCallback(self.trustlens_recorder, stop_on)]
            self.add_callback(stops[0])
        for stop in stops:
            if stop.recorder is not self.trustlens_recorder:
                raise ValueError(
                    f"{type(self).__name__}: a TrustLensCallback watches another recorder than the one this "
                    "trainer records into: give it the trainer's recorder="
                )
            stop.bind(lambda: self._tl_step)

    def _tl_tokenizer(self) -> Any:
        return getattr(self.processing_class, "tokenizer", self.processing_class)

    def _tl_open_recorder(self, run_dir: str | Path, rules: Any) -> Any:
        from trustlens.record import TokenRecorder

        trl_rule = active_rule_of(self.args)
        active = trl_rule.name
        if rules is None:
            rules = default_rules(active, trl_rule.thresholds, topk=self._tl_topk_recordable())
        if active not in [rule.name for rule in resolve_rules(rules)]:
            active = None  # the caller's rule set leaves TRL's rule out
        return TokenRecorder(
            run_dir,
            rules=rules,
            active_rule=active,
            tokenizer=self._tl_tokenizer(),
            config=self._tl_config(),
            sampling=trl_sampling(self.args),
            alerts=self._tl_alerts,
            on_alert=self._tl_on_alert,
            planned_steps=planned_generations(self.args),
        )

    def _tl_topk_recordable(self) -> bool:
        """Whether this run has μ's top-K (a top-K DPPO run) and the recorder takes precomputed
        top-K divergences."""
        from trustlens.record import TokenRecorder

        topk_run = str(getattr(self.args, "divergence_type", "")).startswith("topk_")
        return topk_run and _accepts_topk(TokenRecorder.record)

    def _tl_config(self) -> dict[str, Any]:
        """What run.json states about the TRL run: versions, the GRPO settings, where μ comes from."""
        import transformers

        a = self.args
        mu_source = "vllm" if a.use_vllm else ("rollout_func" if getattr(self, "rollout_func", None) else None)
        generate_every = a.steps_per_generation * self.num_iterations
        dppo = {
            name: getattr(a, name)
            for name in ("divergence_type", "divergence_topk", "clip_ratio_c")
            if getattr(a, name, None) is not None
        }
        return {
            "source": f"trl.{self._tl_base.__name__}",
            "trl_version": trl.__version__,
            "transformers_version": transformers.__version__,
            "trainer_class": self._tl_base.__name__,
            "loss_type": a.loss_type,
            "epsilon_low": float(a.epsilon),
            "epsilon_high": float(a.epsilon_high if a.epsilon_high is not None else a.epsilon),
            "importance_sampling_level": getattr(a, "importance_sampling_level", "token"),
            "beta": float(a.beta),
            "temperature": float(a.temperature),
            "num_generations": self.num_generations,
            "per_device_train_batch_size": a.per_device_train_batch_size,
            "gradient_accumulation_steps": a.gradient_accumulation_steps,
            "steps_per_generation": a.steps_per_generation,
            "num_iterations": self.num_iterations,
            "learning_rate": float(a.learning_rate),
            **dppo,
            "mu_source": mu_source,
            "mu_note": (
                f"μ from {mu_source} sampling log-probs"
                if mu_source
                else "no sampling log-probs in this TRL run: mu_logp is null and every μ-anchored "
                "rule is evaluated on π_old"
            ),
            "old_logp_source": (
                "TRL's recomputation (old_per_token_logps)"
                if a.gradient_accumulation_steps % generate_every != 0
                or (a.use_vllm and a.vllm_importance_sampling_correction)
                else "π (TRL trains on-policy here: no update between generation and loss, π_old = π)"
            ),
        }

    # ---- TRL hooks ----

    def _calculate_rewards(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        rewards = super()._calculate_rewards(*args, **kwargs)
        self._tl_rewards = rewards
        return rewards

    def _generate_and_score_completions(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._tl_rewards = None
        batch = super()._generate_and_score_completions(*args, **kwargs)
        if not self.model.training:
            return batch
        missing = [k for k in BATCH_KEYS if k not in batch]
        if missing:
            raise unsupported(f"the generation batch lacks {', '.join(missing)}")
        self._tl_flush_metrics()
        if self._tl_step >= 0:
            self.trustlens_recorder.end_step(self._tl_step)  # the live alerts judge it now
        self._tl_step += 1
        self._tl_micro = 0
        n = batch["completion_ids"].shape[0]
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        first = self._tl_samples_seen + rank * n
        sample = torch.arange(first, first + n, dtype=torch.long, device=batch["completion_ids"].device)
        self._tl_samples_seen += n * world
        batch[SAMPLE_KEY] = sample
        batch[GROUP_KEY] = sample // self.num_generations
        self._tl_log_samples(batch, rank)
        return batch

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._tl_capture is not None:
            self._tl_capture.append((out[0], out[1], None))
        return out

    def _get_per_token_logps_with_topk(self, *args: Any, **kwargs: Any) -> Any:
        """DPPOTrainer's log-prob pass of a top-K run: (log π, entropies, log π on μ's top-K ids)."""
        out = super()._get_per_token_logps_with_topk(*args, **kwargs)
        if self._tl_capture is not None:
            self._tl_capture.append(tuple(out[:3]))
        return out

    def _compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> torch.Tensor:
        if not self.model.training or SAMPLE_KEY not in inputs:
            return super()._compute_loss(model, inputs, *args, **kwargs)
        self._tl_capture = []
        try:
            loss = super()._compute_loss(model, inputs, *args, **kwargs)
            passes = self._tl_capture
        finally:
            self._tl_capture = None
        if len(passes) != 1:
            raise unsupported(f"expected one log-prob pass in _compute_loss, saw {len(passes)}")
        logps, entropies, topk_logps = passes[0]
        self._tl_record(inputs, logps, entropies, topk_logps)
        self._tl_micro += 1
        return loss

    def _tl_on_log(self, logs: dict[str, Any]) -> None:
        """Keep TRL's logged numbers (they reach every TrainerCallback) for the current step."""
        if not self.accelerator.is_main_process:
            return
        for name, value in logs.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self._tl_pending[f"trl/{name}"].append(float(value))

    def train(self, *args: Any, **kwargs: Any) -> Any:
        if not self._tl_owns_recorder:
            try:
                return super().train(*args, **kwargs)
            finally:
                self._tl_flush_metrics()
        with self.trustlens_recorder:
            try:
                return super().train(*args, **kwargs)
            finally:
                self._tl_flush_metrics()

    # ---- recording ----

    def _tl_update(self) -> int:
        """Optimizer steps since the current generation (see trustlens.integrations.trl)."""
        per_update = min(self.args.gradient_accumulation_steps, self.args.steps_per_generation)
        return self._tl_micro // max(per_update, 1)

    def _tl_record(
        self,
        inputs: dict[str, Any],
        logps: torch.Tensor,
        entropies: torch.Tensor | None,
        topk_logps: torch.Tensor | None = None,  # (B, T, K) log π on μ's top-K ids (top-K DPPO)
    ) -> None:
        mask = inputs["completion_mask"]
        if inputs.get("tool_mask") is not None:
            mask = mask * inputs["tool_mask"]
        pi = logps.detach()
        old = inputs.get("old_per_token_logps")
        topk = {}
        mu_topk = inputs.get("sampling_topk_logps")
        if topk_logps is not None and mu_topk is not None and _accepts_topk(self.trustlens_recorder.record):
            topk = _topk_at(topk_logps.detach(), mu_topk, mask.bool())
        fields = {
            "token_ids": inputs["completion_ids"],
            "response_mask": mask.bool(),
            "pi_logp": pi,
            "advantages": inputs["advantages"],
            "old_logp": pi if old is None else old,
            "entropy": None if entropies is None else entropies.detach(),
            "sample_ids": inputs[SAMPLE_KEY],
            "group_ids": inputs[GROUP_KEY],
            **topk,
        }
        mu = inputs.get("sampling_per_token_logps")
        if mu is None:
            self._tl_record_rows(fields, None)
            return
        # vLLM leaves NaN where it could not score a token: those sequences get a null μ
        unscored = (torch.isnan(mu) & mask.bool()).any(dim=1)
        if not bool(unscored.any()):
            self._tl_record_rows(fields, mu)
            return
        for rows, mu_rows in ((~unscored, mu), (unscored, None)):
            if bool(rows.any()):
                subset = {k: None if v is None else v[rows] for k, v in fields.items()}
                self._tl_record_rows(subset, None if mu_rows is None else mu_rows[rows])

    def _tl_record_rows(self, fields: dict[str, Any], mu: torch.Tensor | None) -> None:
        self.trustlens_recorder.record(self._tl_step, mu_logp=mu, update=self._tl_update(), **fields)

    def _tl_log_samples(self, batch: dict[str, Any], rank: int) -> None:
        tok = self._tl_tokenizer()
        n = batch["completion_ids"].shape[0]
        advantages, mask = batch["advantages"], batch["completion_mask"]
        rewards = None
        if self._tl_rewards is not None:
            per_func = self._tl_rewards[rank * n : (rank + 1) * n].float().cpu()
            rewards = (per_func * self.reward_weights.float().cpu()).nansum(dim=1)
            rewards[torch.isnan(per_func).all(dim=1)] = float("nan")
        self.trustlens_recorder.log_samples(
            self._tl_step,
            prompts=tok.batch_decode(batch["prompt_ids"], skip_special_tokens=True),
            responses=tok.batch_decode(batch["completion_ids"], skip_special_tokens=True),
            rewards=None if rewards is None else rewards.tolist(),
            advantages=advantages.tolist() if advantages.dim() == 1 else _masked_mean(advantages, mask).tolist(),
            lengths=mask.sum(dim=1).tolist(),
            sample_ids=batch[SAMPLE_KEY].tolist(),
            group_ids=batch[GROUP_KEY].tolist(),
        )

    def _tl_flush_metrics(self) -> None:
        """Write the TRL logs gathered during the current step, one mean per name."""
        if self._tl_pending and self._tl_step >= 0:
            means = {name: sum(v) / len(v) for name, v in self._tl_pending.items()}
            self.trustlens_recorder.log_metrics(self._tl_step, means)
        self._tl_pending.clear()


class _LogCallback(TrainerCallback):
    """Hands every `Trainer.log` call's values to the trainer's hook."""

    def __init__(self, trainer: TrustLensGRPOMixin) -> None:
        self.trainer = trainer

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs:
            self.trainer._tl_on_log(logs)


def _accepts_topk(record: Callable) -> bool:
    """Whether a recorder's `record` takes precomputed `topk_tv` / `topk_kl`."""
    import inspect

    params = inspect.signature(record).parameters
    return "topk_tv" in params and "topk_kl" in params


def _topk_at(pi_topk: torch.Tensor, mu_topk: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """{"topk_tv", "topk_kl"} (B, T) from log π and log μ on μ's top-K ids (B, T, K), computed at
    the masked positions only (TRL pads the others, and tool tokens, with log-probs 0); 0 elsewhere."""
    from trustlens.divergence import topk_divergence_from_logp

    tv = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    kl = torch.zeros_like(tv)
    if bool(mask.any()):
        tv[mask], kl[mask] = topk_divergence_from_logp(pi_topk[mask].float(), mu_topk.to(mask.device)[mask].float())
    return {"topk_tv": tv, "topk_kl": kl}


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row mean of (B, T) `x` over the positions where `mask` is set (0 for an empty row)."""
    mask = mask.to(x.dtype)
    return (x * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
