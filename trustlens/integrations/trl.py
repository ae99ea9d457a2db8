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

Steps: trustlens `step` = one TRL generation (a rollout batch, reused for
`steps_per_generation × num_iterations` micro-batches); `update` = optimizer steps taken since
that generation (for a configuration that accumulates more micro-batches than one generation
holds, the pass over the generation batch), so (step, update, sample, pos) stays unique. Sample
ids are unique within the run across ranks; samples of one prompt share a group id.

TRL's private methods change between releases: this module checks at class creation that the
ones it wraps exist, takes extra arguments through, and raises `UnsupportedTRLVersion`, naming
the installed version, when something it relies on is missing.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import trl
from packaging.version import Version
from transformers import TrainerCallback
from trl import GRPOTrainer

from trustlens.rules import RULES, resolve_rules

# TRL releases this integration supports: tests/test_integrations_trl.py passes on 0.29.1, 1.0.0,
# 1.8.0 and 1.16.0 (older TRL does not import with transformers 5). An older release is refused, a
# newer one is tried with a warning.
MIN_TRL = Version("0.29.0")
MAX_TESTED_TRL = Version("1.16.0")

# the private GRPOTrainer methods the hook wraps
_WRAPPED = (
    "_generate_and_score_completions",
    "_compute_loss",
    "_get_per_token_logps_and_entropies",
    "_calculate_rewards",
)
# keys of TRL's batch dict the hook reads
_BATCH_KEYS = ("prompt_ids", "completion_ids", "completion_mask", "advantages")
# keys the hook adds to TRL's batch dict: they are shuffled and split with the batch
SAMPLE_KEY = "trustlens_sample"
GROUP_KEY = "trustlens_group"

# TRL loss types whose clipped surrogate blocks exactly the tokens `minirl` blocks
_CLIPPED_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


class UnsupportedTRLVersion(RuntimeError):
    """The installed TRL lacks something the trustlens hook relies on."""


def _unsupported(what: str) -> UnsupportedTRLVersion:
    return UnsupportedTRLVersion(
        f"trustlens.integrations.trl: {what} (installed trl {trl.__version__}; supported "
        f"trl {MIN_TRL} to {MAX_TESTED_TRL})"
    )


def check_trl(trainer_cls: type) -> None:
    """Raise UnsupportedTRLVersion when `trainer_cls` or the installed TRL cannot be hooked."""
    if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, GRPOTrainer)):
        raise TypeError(f"with_trustlens expects GRPOTrainer or a subclass of it, got {trainer_cls!r}")
    if Version(trl.__version__) < MIN_TRL:
        raise _unsupported(f"trl {trl.__version__} is older than the oldest supported release")
    missing = [name for name in _WRAPPED if not callable(getattr(trainer_cls, name, None))]
    if missing:
        raise _unsupported(f"{trainer_cls.__name__} has no method {', '.join(missing)}")
    if Version(trl.__version__) > MAX_TESTED_TRL:
        warnings.warn(
            f"trustlens: trl {trl.__version__} is newer than the newest tested release "
            f"({MAX_TESTED_TRL}); recording may fail with an UnsupportedTRLVersion error",
            stacklevel=3,
        )


Thresholds = tuple[float | None, float | None]  # (low, high); None keeps the rule's default


def default_rules(
    active_rule: str | None = None, thresholds: Thresholds | None = None, *, topk: bool = False
) -> dict[str, Thresholds]:
    """{rule: (low, high)} for every rule TRL's tensors can decide — with topk=True (a top-K DPPO
    run) the top-K rules too — default thresholds except `thresholds` for `active_rule`."""
    inputs = {"old_logp", "topk_tv", "topk_kl"} if topk else {"old_logp"}
    rules: dict[str, Thresholds] = {name: (None, None) for name, rule in RULES.items() if set(rule.needs) <= inputs}
    if active_rule is not None and thresholds is not None:
        rules[active_rule] = thresholds
    return rules


def active_rule_of(args: Any) -> tuple[str | None, Thresholds | None]:
    """The trustlens rule TRL trains with under GRPOConfig `args`, with its (low, high); (None,
    None) for a loss no rule reproduces (sapo, vespo, sequence-level importance sampling)."""
    low = float(args.epsilon)
    high = float(args.epsilon_high if args.epsilon_high is not None else args.epsilon)
    divergence = getattr(args, "divergence_type", None)  # DPPOConfig: TRL's divergence mask vs μ
    if divergence is not None:
        return f"dppo_{divergence}", (low, high)
    if getattr(args, "importance_sampling_level", "token") != "token":
        return None, None
    if args.loss_type in _CLIPPED_LOSSES:
        return "minirl", (low, high)
    if args.loss_type == "cispo":  # TRL caps π/π_old at ε_high; trustlens' cispo never blocks
        return "cispo", (None, max(high - 1.0, 0.0))
    return None, None


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
        **kwargs: Any,
    ) -> None:
        if (trustlens_dir is None) == (recorder is None):
            raise ValueError(
                f"{type(self).__name__}: pass exactly one of trustlens_dir= (a new run directory) "
                "or recorder= (an open TokenRecorder)"
            )
        super().__init__(*args, **kwargs)
        if getattr(self.args, "use_liger_loss", False) or (
            getattr(self, "use_liger_kernel", False) and hasattr(self, "compute_liger_loss")
        ):
            raise _unsupported("the Liger GRPO loss bypasses _compute_loss; set use_liger_kernel=False")
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

    # ---- setup ----

    def _tl_tokenizer(self) -> Any:
        return getattr(self.processing_class, "tokenizer", self.processing_class)

    def _tl_open_recorder(self, run_dir: str | Path, rules: Any) -> Any:
        from trustlens.recorder import TokenRecorder

        active, thresholds = active_rule_of(self.args)
        if rules is None:
            rules = default_rules(active, thresholds, topk=self._tl_topk_recordable())
        if active not in [rule.name for rule in resolve_rules(rules)]:
            active = None  # the caller's rule set leaves TRL's rule out
        return TokenRecorder(
            run_dir, rules=rules, active_rule=active, tokenizer=self._tl_tokenizer(), config=self._tl_config()
        )

    def _tl_topk_recordable(self) -> bool:
        """Whether this run has μ's top-K (a top-K DPPO run) and the recorder takes precomputed
        top-K divergences."""
        from trustlens.recorder import TokenRecorder

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
        missing = [k for k in _BATCH_KEYS if k not in batch]
        if missing:
            raise _unsupported(f"the generation batch lacks {', '.join(missing)}")
        self._tl_flush_metrics()
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
            raise _unsupported(f"expected one log-prob pass in _compute_loss, saw {len(passes)}")
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
        """Optimizer steps since the current generation (see the module docstring)."""
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


def engine_rollout(precision: str = "bf16", *, logit_noise: float = 0.0, seed: int | None = None) -> Callable:
    """A TRL `rollout_func` sampling with trustlens' RolloutEngine (trustlens.train.rollout).

    The engine holds its own copy of the policy in `precision` ("bf16" as an inference server
    serves it, or "fp32"), receives the trainer's weights before every generation, and samples
    with a KV cache at TRL's `temperature` up to `max_completion_length` tokens. It returns the
    sampling log-probabilities, so a run without vLLM still records μ and a real training–
    inference mismatch. `logit_noise` imitates a noisier engine (RolloutConfig); `seed` seeds its
    sampling (default: TRL's seed, plus the process index). Prompts are text or chat messages.
    """
    from trustlens.train.rollout import RolloutConfig, RolloutEngine

    state: dict[str, Any] = {}

    def rollout(prompts: list, trainer: Any) -> dict[str, list]:
        tok = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        policy = trainer.accelerator.unwrap_model(trainer.model)
        if "engine" not in state:
            config = RolloutConfig(
                temperature=trainer.args.temperature,
                max_new_tokens=trainer.args.max_completion_length,
                precision=precision,
                logit_noise=logit_noise,
            )
            engine = RolloutEngine(policy, config, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
            # TRL and accelerate patch `forward` on the instances (fused log-prob head, autocast)
            # with closures over the trainer's own modules: the copy must run its own weights.
            for module in engine.model.modules():
                module.__dict__.pop("forward", None)
            base = trainer.args.seed if seed is None else seed
            state["engine"] = engine
            state["generator"] = torch.Generator().manual_seed(base + trainer.accelerator.process_index)
        else:
            state["engine"].sync_weights(policy)
        prompt_ids = [_prompt_ids(tok, p) for p in prompts]
        out = state["engine"].generate(prompt_ids, generator=state["generator"])
        lengths = out.lengths().tolist()
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": [out.response_ids[i, :n].tolist() for i, n in enumerate(lengths)],
            "logprobs": [out.mu_logp[i, :n].tolist() for i, n in enumerate(lengths)],
        }

    return rollout


def _prompt_ids(tok: Any, prompt: str | list[dict]) -> list[int]:
    """Token ids of a text prompt, or of a chat prompt with the generation prompt appended."""
    if isinstance(prompt, str):
        return list(tok(text=prompt)["input_ids"])
    encoded = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(encoded["input_ids"])


_CLASSES: dict[type, type] = {}


def with_trustlens(trainer_cls: type = GRPOTrainer) -> type:
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


TrustLensGRPOTrainer = with_trustlens(GRPOTrainer)
