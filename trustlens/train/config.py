"""Settings of the built-in training run: `TrainConfig` and its named presets.

Kept free of torch at import time, so that `trustlens --help` stays fast; the checks that need
the rule registry or torch import them when a config is built.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

MODEL_KINDS = ("dense", "moe")  # `model` values: the Llama or the Qwen3-MoE (trustlens.train.model.MODELS)
RANDOM_INIT = "random"  # `checkpoint` value that starts from a random model instead of a warm start
TV_MEASURES = ("binary_tv", "topk_tv")  # the measures `tv_bound` sets the bound of
# see trustlens.rules.loss.LOSS_AGG_MODES
LOSS_AGG_MODES_HELP = "token-mean, seq-mean-token-sum-norm or seq-mean-token-mean"


@dataclass
class TrainConfig:
    rule: str = "dppo_binary_tv"  # trust-region rule that gates the updates (docs/rules.md)
    low: float | None = None  # the rule's threshold when A ≤ 0; None = the rule's default
    high: float | None = None  # the rule's threshold when A > 0; None = the rule's default
    tv_bound: float | None = None  # δ of the TV-bounded DPPO rules where low/high give none; None = 0.15
    steps: int = 160  # training steps; each is one rollout batch and `minibatches × epochs` updates
    prompts_per_step: int = 16  # problems per step, summed over all ranks
    group_size: int = 8  # G: responses sampled per problem (the GRPO group)
    minibatches: int = 4  # optimizer updates per pass over the rollout batch
    epochs: int = 1  # passes over the rollout batch
    lr: float = 3e-5  # AdamW learning rate (constant after the warm-up); 1e-4 and above degrade this warm start
    warmup_steps: int = 0  # learning-rate warm-up: step t trains at lr·min(1, (t + 1)/warmup_steps); 0 = none
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max global gradient norm (L2), before the optimizer step
    clip_ratio_c: float = 10.0  # C: cap of the importance weight min(π/μ, C)
    loss_agg_mode: str = "token-mean"  # "token-mean", "seq-mean-token-sum-norm" or "seq-mean-token-mean"
    scale_advantages: bool = True  # divide by the group std (GRPO); False = Dr. GRPO
    temperature: float = 0.5  # sampling temperature τ of the rollouts (μ and π both use logits / τ)
    max_new_tokens: int = 24  # response length cap, in tokens
    topk: int = 20  # K of μ's recorded top-K
    rollout_precision: str = "bf16"  # engine precision: "bf16", "fp32", "fp32_exact" or "fp8" (W8A8 float8_e4m3fn)
    rollout_lag: int = 0  # k: rollouts of step t come from the weights of step t − k (asynchronous RL)
    logit_noise: float = 0.0  # std of Gaussian noise on the engine's logits (0 = none)
    engine: str = "clean"  # a planted log-probability bug of the engine (trustlens.train.engine_defects)
    eval_every: int = 20  # evaluate every this many steps (and at the start and the end)
    eval_size: int = 500  # held-out problems in each evaluation (greedy decoding)
    partial_credit: float = 0.0  # reward share for right scratchpad steps when the answer is wrong
    checkpoint: str | None = None  # warm-start folder; None = the shipped one, "random" = no warm start
    model: str = "dense"  # the policy: "dense" (Llama) or "moe" (Qwen3-MoE, 8 experts, top-2); its warm start
    routing_replay: bool = False  # MoE: π_old and π computed with the engine's routing (R3)
    routing_split_every: int = 0  # MoE: the shadow forward under μ's routing every this many steps; 0 = never
    seed: int = 0  # seeds the problems, the sampling and the minibatch order
    threads: int = 1  # torch CPU threads per process
    record: bool = True  # False: NullRecorder (nothing written; for overhead measurements)
    sample_every: int = 1  # log prompts and responses every this many steps
    keep_rate: float | None = None  # record every token that matters and this share of the rest (Keep); None = all
    # with keep_rate: rules whose blocked tokens are all kept too, besides the active rule's (Keep.rules)
    keep_rules: list[str] = field(default_factory=list)
    mirror: str | None = None  # live scalars from rank 0: "tensorboard:LOGDIR", "wandb" or "wandb:PROJECT"
    alerts: bool = False  # raise the collapse alerts and doctor findings live on rank 0 (trustlens.live)
    stop_on: str = "never"  # stop on a live alert of this severity or above: critical, warning or never
    checkpoint_every: int = 10  # with stop_on: a rolling checkpoint every this many steps (trustlens.train.stopping)
    keep_checkpoints: int = 3  # with stop_on: rolling checkpoints kept, besides the ones a stop would keep
    flush_seconds: float = 30.0  # the recorder writes rows older than this (with alerts: each step at its end)

    def __post_init__(self) -> None:
        from trustlens.core.argument_checks import (
            check_bool,
            check_choice,
            check_existing_dir,
            check_fraction,
            check_int,
            check_mirror,
            check_nonnegative_number,
            check_positive,
            check_stop_on,
        )
        from trustlens.rules.loss import LOSS_AGG_MODES

        for name in _INTS:  # a float (even 2.0) is refused, not truncated
            check_int(name, getattr(self, name))
        for name in ("temperature", "lr", "grad_clip", "clip_ratio_c", "flush_seconds"):  # finite and > 0
            check_positive(name, getattr(self, name))
        for name in ("weight_decay", "logit_noise"):  # finite and ≥ 0: NaN is not "no noise"
            check_nonnegative_number(name, getattr(self, name))
        if self.tv_bound is not None:
            check_fraction("tv_bound", self.tv_bound, zero=False, one=False)
        samples = self.prompts_per_step * self.group_size
        if self.minibatches > samples:
            raise ValueError(
                f"minibatches must be ≤ the samples of a step (prompts_per_step × group_size = {samples}), "
                f"got {self.minibatches}: a minibatch needs at least one sample"
            )
        self.rule_thresholds()  # validates low/high against the rule
        for name in (
            "steps",
            "prompts_per_step",
            "minibatches",
            "epochs",
            "eval_every",
            "threads",
            "sample_every",
            "max_new_tokens",
            "topk",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be ≥ 2 (GRPO compares responses within a group), got {self.group_size}")
        if not 0 <= self.partial_credit < 1:
            raise ValueError(f"partial_credit must be in [0, 1), got {self.partial_credit}")
        if self.rollout_lag < 0:
            raise ValueError(f"rollout_lag must be ≥ 0, got {self.rollout_lag}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be ≥ 0, got {self.warmup_steps}")
        for name in ("scale_advantages", "record", "alerts", "routing_replay"):
            check_bool(name, getattr(self, name))
        check_stop_on("stop_on", self.stop_on)
        self._check_routing()
        for name in ("checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.checkpoint is not None and self.checkpoint != RANDOM_INIT:
            check_existing_dir("checkpoint", self.checkpoint)  # a missing one fails here, not after the setup
        if self.mirror is not None:
            check_mirror("mirror", self.mirror)
        if self.eval_size < 0:
            raise ValueError(f"eval_size must be ≥ 0, got {self.eval_size}")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"loss_agg_mode must be one of {', '.join(LOSS_AGG_MODES)}, got {self.loss_agg_mode!r}")
        if self.keep_rate is not None and not 0 < self.keep_rate <= 1:
            raise ValueError(f"keep_rate must be in (0, 1], got {self.keep_rate}")
        self._check_keep_rules()
        from trustlens.train.rollout import PRECISIONS

        check_choice("rollout_precision", self.rollout_precision, sorted(PRECISIONS))  # named as the flag names it
        self.rollout_config()  # validates temperature, precision, noise, lag, engine
        if self.engine == "raw_logprobs" and self.temperature == 1:
            raise ValueError(
                f"engine 'raw_logprobs' needs a temperature ≠ 1 (raw = processed there), got {self.temperature}"
            )
        if self.engine == "resume" and self.steps < 2:
            raise ValueError(
                f"engine 'resume' restarts the run after step steps // 2 − 1: it needs steps ≥ 2, got {self.steps}"
            )

    def _check_keep_rules(self) -> None:
        """ValueError unless `keep_rules` is a list of distinct registry names given with a keep_rate."""
        from trustlens.rules import get_rule

        rules = self.keep_rules
        if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
            raise ValueError(f"keep_rules must be a list of rule names, e.g. ['ppo', 'rs_geo'], got {rules!r}")
        if len(set(rules)) != len(rules):
            raise ValueError(f"keep_rules lists a rule twice: {rules}")
        for rule in rules:
            try:
                get_rule(rule)
            except KeyError as err:
                raise ValueError(f"keep_rules: {err.args[0]}") from None
        if rules and self.keep_rate is None:
            raise ValueError(
                f"keep_rules {rules} need a keep_rate: without one every token is recorded (pass keep_rate=0.01)"
            )

    def _check_routing(self) -> None:
        """The model kind, and routing settings only on a mixture of experts (one line naming the fix)."""
        from trustlens.core.argument_checks import check_choice

        check_choice("model", self.model, MODEL_KINDS)
        if self.routing_split_every < 0:
            raise ValueError(f"routing_split_every must be ≥ 0, got {self.routing_split_every}")
        asked = {"routing_replay": self.routing_replay, "routing_split_every": self.routing_split_every}
        for name, on in asked.items():
            if on and self.model == "dense":
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} needs a mixture-of-experts model, and this run's is dense: add --model moe")

    def lr_at(self, step: int) -> float:
        """The learning rate of `step`: lr · min(1, (step + 1) / warmup_steps), lr without a warm-up."""
        return self.lr if self.warmup_steps == 0 else self.lr * min(1.0, (step + 1) / self.warmup_steps)

    def rule_thresholds(self) -> dict[str, tuple[float | None, float | None]]:
        """(low, high) of every registered rule as this run evaluates it: the active rule with
        `low`/`high`, the TV-bounded DPPO rules with `tv_bound` where those give none, None
        (the rule's default) elsewhere. Raises ValueError for thresholds the rule refuses."""
        from trustlens.rules import RULES, get_rule

        def bound(name: str, given: float | None) -> float | None:
            return self.tv_bound if given is None and RULES[name].measure in TV_MEASURES else given

        active = get_rule(self.rule)
        rules = {name: (bound(name, None), bound(name, None)) for name in RULES}
        rules[self.rule] = (bound(self.rule, self.low), bound(self.rule, self.high))
        active.with_thresholds(*rules[self.rule])
        return rules

    def rollout_config(self):
        """The RolloutConfig of the engine (validated)."""
        from trustlens.train.rollout import RolloutConfig

        return RolloutConfig(
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            topk=self.topk,
            precision=self.rollout_precision,
            logit_noise=self.logit_noise,
            lag=self.rollout_lag,
            defect=self.engine,
        )

    def sampling(self) -> dict:
        """How the engine reports its sampling settings (TokenRecorder's `sampling`)."""
        from trustlens.train.engine_defects import engine_sampling

        return engine_sampling(self.engine, self.temperature)


# the integer settings of TrainConfig
_INTS = (
    "steps",
    "prompts_per_step",
    "group_size",
    "minibatches",
    "epochs",
    "max_new_tokens",
    "topk",
    "rollout_lag",
    "warmup_steps",
    "eval_every",
    "eval_size",
    "seed",
    "threads",
    "sample_every",
    "checkpoint_every",
    "keep_checkpoints",
    "routing_split_every",
)

_COLLAPSE = dict(rollout_precision="fp8", rollout_lag=16, lr=6e-5, steps=250, eval_every=10, tv_bound=0.1)

# Named settings; explicit flags override them. "default" is what `trustlens train` runs.
PRESETS: dict[str, dict] = {
    # what `trustlens train` and `trustlens demo` run: the TrainConfig defaults (τ = 0.5 rollouts)
    "default": {},
    # seconds: a smoke test of the whole pipeline
    "quick": dict(steps=3, prompts_per_step=4, group_size=4, minibatches=2, eval_every=3, eval_size=16),
    # asynchronous RL: rollouts come from weights two steps old; the mismatch grows with how far
    # the policy moves in two steps (this, fp8 and offpolicy sample at τ = 1, as measured)
    "stale": dict(rollout_lag=2, temperature=1.0),
    # a W8A8 float8 inference engine (weights and activations of the blocks' linear layers)
    "fp8": dict(rollout_precision="fp8", temperature=1.0),
    # the no-trust-region story (asynchronous RL): the default schedule at twice its learning rate
    # on rollouts of an fp8 engine whose weights are 16 steps old, so that μ drifts far from π,
    # and a DPPO bound δ = 0.1 (at the paper's 0.15 DPPO sags on 2 of 3 seeds); measured
    # (docs/train.md): pg_is and cispo collapse on every seed within 250 steps, dppo_binary_tv
    # never does
    "collapse": _COLLAPSE,
    # learns, then collapses (as the paper's runs do; with --rule pg_is): the collapse preset's stale
    # fp8 engine, but the learning rate warms up over 150 steps, so that while it is small the stale
    # μ stays near π and the run learns; measured in docs/alerts.md
    "late_collapse": {**_COLLAPSE, "warmup_steps": 150, "lr": 1e-4, "steps": 400},
    # the shipped sample runs (data/sample_run, `trustlens make-sample`): the collapse preset on
    # seed 1 (of the claims runs, where pg_is collapses soonest), every token that matters kept
    # and 3% of the rest, so that a run is about 1.5 MB
    "sample": {**_COLLAPSE, "seed": 1, "keep_rate": 0.03},
    # more updates per rollout batch and a larger step: π drifts far from μ, rules disagree most
    "offpolicy": dict(minibatches=8, epochs=2, lr=1e-4, temperature=1.0),
}


def field_defaults() -> dict[str, object]:
    """{TrainConfig field: its default value} (a list field's default made anew)."""
    return {f.name: f.default_factory() if f.default_factory is not MISSING else f.default for f in fields(TrainConfig)}


def config_from_preset(preset: str = "default", **overrides) -> TrainConfig:
    """The TrainConfig of a preset with `overrides` (None values are ignored) applied."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown TrainConfig fields {unknown}")
    given = {k: v for k, v in overrides.items() if v is not None}
    return TrainConfig(**{**PRESETS[preset], **given})
