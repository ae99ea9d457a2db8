"""The GRPO/DPPO trainer of the built-in run: rollouts from a separate engine, any trust-region rule.

One training step, top to bottom (`train` below):

 1. Each rank draws `prompts_per_step / world_size` problems and the rollout engine (its own
    bf16/fp8 copy of the weights, possibly `rollout_lag` steps stale, `trustlens.train.rollout`)
    samples G responses per problem at temperature τ, reporting log μ(a_t) and μ's top-K for
    every token.
 2. Rewards from the task; GRPO group advantages A_i = (r_i − mean_G r) / (std_G r + ε), one per
    response, broadcast to its tokens.
 3. The trainer recomputes log π_old(a_t) with its own float32 weights, logits divided by τ like
    the engine's (docs/rules.md). μ vs π_old is the training–inference mismatch, logged per step.
 4. The batch is shuffled and split into `minibatches`; each minibatch is one optimizer update
    (for `epochs` passes), so from the second update on π has moved away from μ and π_old and
    the trust-region rule has something to decide. The loss is `trustlens.rules.loss.policy_loss`
    under the configured rule; AdamW with gradient-norm clipping.
 5. Every update is recorded token by token (`TokenRecorder`), with every rule of
    `trustlens.rules.RULES` evaluated counterfactually on the same tokens. The top-K TV/KL of π
    vs μ and the rule decisions are computed once per update and handed to the recorder.
 6. The engine receives the new weights (`sync_weights`), as an inference server would (and
    serves them `rollout_lag` steps later).
 7. The step's metrics are logged once, from rank 0, reduced over ranks (trustlens.train.pooled):
    block rates and means are pooled over every rank's tokens (Σ counts / Σ tokens), not
    averaged over ranks.

Held-out evaluation decodes with an engine of the run's precision that holds the current
weights (no lag): it measures the policy being trained.

Deviations from textbook GRPO (Shao et al. 2024), all common in current practice:
 - no KL penalty to a reference model (β = 0), as in DAPO, Dr. GRPO and the DPPO paper;
 - the importance weight and the trust region are anchored on the rollout policy μ, not on
   π_old (the decoupled objective of DPPO): w = min(π/μ, C), and `ppo` clips π/μ; π_old is
   recomputed for the mismatch metrics and for the rules anchored on it (`minirl`,
   `*_recompute`, `grpo_tis`);
 - the loss is a token mean over the minibatch (DAPO) by default rather than a mean over
   sequences of per-sequence token means (`loss_agg_mode`);
 - groups whose rewards are all equal get A = 0 and stay in the batch (no dynamic sampling);
 - the group std is the unbiased one (as verl); `scale_advantages=False` drops it (Dr. GRPO);
 - with data parallelism each rank takes the token mean of its own shard and the gradients are
   averaged across ranks, so ranks weigh equally rather than tokens.

Units: log-probabilities in nats, TV in probability mass, KL in nats, times in seconds.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from trustlens.divergence import entropy_from_logits, topk_divergence
from trustlens.record import NullRecorder, TokenRecorder
from trustlens.record.args import distributed_rank
from trustlens.rules import evaluate_all
from trustlens.rules.loss import policy_loss
from trustlens.run.aggregates import Keep
from trustlens.train.config import RANDOM_INIT, TrainConfig
from trustlens.train.engine_defects import deliver, support_of
from trustlens.train.evaluate import decode_responses, evaluate_accuracy
from trustlens.train.pooled import (
    Pooled,
    log_reduced,
    masked_mean,
    mean_of_ratios,
    ratio,
    std,
)
from trustlens.train.rollout import RolloutEngine, response_logits
from trustlens.train.step_metrics import BlockedCounter, mismatch_metrics
from trustlens.train.stopping import AlertStop, alert_postfix
from trustlens.train.tasks import ArithmeticTask
from trustlens.train.world import average_gradients, init_world


@dataclass
class TrainResult:
    run_dir: Path | None  # where the run was recorded (None with record=False)
    eval_accuracy: dict[int, float] = field(default_factory=dict)  # step -> held-out greedy accuracy
    eval_accuracy_sampled: dict[int, float] = field(default_factory=dict)  # step -> sampled at τ
    rewards: list[float] = field(default_factory=list)  # mean training reward per step
    step_times: list[float] = field(default_factory=list)  # seconds per training step
    stopped: dict | None = None  # why the run stopped on a live alert (run.json `stopped`; rank 0), else None
    stopped_step: int | None = None  # the last step trained when it stopped on a live alert (every rank), else None


# ---------------------------------------------------------------------------------------------
# The pieces of a step.


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages: each reward minus its group's mean, over the group's std when `scale`.

    rewards: (N·G,) float, groups of G consecutive responses. Returns (N·G,) float32.
    """
    r = rewards.float().view(-1, group_size)
    adv = r - r.mean(-1, keepdim=True)
    if scale:
        adv = adv / (r.std(-1, keepdim=True) + eps)
    return adv.reshape(-1)


def token_logp(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[ids] without materialising the log-softmax: (B, T, V), (B, T) -> (B, T)."""
    return logits.gather(-1, ids[..., None]).squeeze(-1) - logits.logsumexp(-1)


def load_policy(cfg: TrainConfig):
    """(model, tokenizer, meta) of the warm start, or a random model when checkpoint == "random"."""
    from trustlens.train.model import ModelConfig, build_model, build_tokenizer, load_checkpoint

    if cfg.checkpoint == RANDOM_INIT:
        return build_model(ModelConfig(), seed=cfg.seed), build_tokenizer(), {"checkpoint": RANDOM_INIT}
    return load_checkpoint(cfg.checkpoint)


def task_of(meta: dict, cfg: TrainConfig) -> ArithmeticTask:
    """The task the warm start was trained on (its meta.json), with the run's partial credit."""
    trained_on = meta.get("config", {}).get("task", {})
    return ArithmeticTask(**{**trained_on, "partial_credit": cfg.partial_credit})


def make_recorder(cfg: TrainConfig, run_dir: Path | None, tokenizer, rules: dict):
    """The run's TokenRecorder, or a NullRecorder when nothing is to be written."""
    if not cfg.record or run_dir is None:
        return NullRecorder()
    rank, world_size = distributed_rank()
    mirror = None
    if cfg.mirror is not None and rank == 0:
        from trustlens.export.mirror import make_mirror

        # rank 0 streams its shard of each step's rows and the metrics `log_reduced` reduced over all
        # ranks: under data parallelism those win over the same names computed from the shard
        mirror = make_mirror(cfg.mirror, shard=world_size > 1)
    keep = None if cfg.keep_rate is None else Keep(rate=cfg.keep_rate, seed=cfg.seed, rules=cfg.keep_rules)
    live = (cfg.alerts or cfg.stop_on != "never") and rank == 0  # rank 0 judges (trustlens.train.stopping)
    return TokenRecorder(
        run_dir,
        rules=rules,
        active_rule=cfg.rule,
        tokenizer=tokenizer,
        config=asdict(cfg),
        mirror=mirror,
        keep=keep,
        sampling=cfg.sampling(),
        alerts=live,
        flush_seconds=cfg.flush_seconds,
    )


# ---------------------------------------------------------------------------------------------
# The run.


def train(cfg: TrainConfig, run_dir: str | Path | None, *, progress: bool = True) -> TrainResult:
    """Run `cfg` and record it into `run_dir` (see the module docstring). Returns the curves."""
    world = init_world()
    torch.set_num_threads(cfg.threads)
    if cfg.prompts_per_step % world.size:
        raise ValueError(
            f"prompts_per_step ({cfg.prompts_per_step}) must be divisible by the world size ({world.size})"
        )
    run_dir = Path(run_dir) if run_dir is not None and cfg.record else None
    rng = torch.Generator().manual_seed(cfg.seed * 1_000_003 + world.rank)

    model, tokenizer, meta = load_policy(cfg)
    model.train()
    rollout_cfg = cfg.rollout_config()
    engine = RolloutEngine(model, rollout_cfg, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
    # evaluation measures the current policy: the engine itself unless it lags
    evaluator = engine
    if rollout_cfg.lag:
        evaluator = RolloutEngine(
            model, replace(rollout_cfg, lag=0), eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id
        )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    task = task_of(meta, cfg)
    eval_problems = task.eval_set(cfg.eval_size, seed=0)
    # the active rule with its thresholds, every other rule at its defaults (counterfactual)
    # but for the TV bound of the preset, if any
    rules = cfg.rule_thresholds()
    low, high = rules[cfg.rule]
    rule_names = list(rules)

    n_prompts = cfg.prompts_per_step // world.size
    n_rows = n_prompts * cfg.group_size  # responses per rank per step
    result = TrainResult(run_dir)
    bar = _progress_bar(cfg.steps, progress and world.main)
    stopper = AlertStop(cfg.stop_on, cfg.checkpoint_every, cfg.keep_checkpoints, run_dir, world, cfg.eval_size)
    with make_recorder(cfg, run_dir, tokenizer, rules) as recorder:
        recording = not isinstance(recorder, NullRecorder)  # the entropy below is for the record only
        for step in range(cfg.steps + 1):
            metrics: dict[str, float | Pooled] = {}
            if cfg.eval_size and (step % cfg.eval_every == 0 or step == cfg.steps):
                t = time.perf_counter()
                accuracy = evaluate_accuracy(evaluator, tokenizer, task, eval_problems, world)
                result.eval_accuracy[step] = accuracy["eval/accuracy"]
                result.eval_accuracy_sampled[step] = accuracy["eval/accuracy_sampled"]
                metrics.update({**accuracy, "time/eval": time.perf_counter() - t})
            if step == cfg.steps:  # the last pass only evaluates the final weights
                log_reduced(recorder, world, step, metrics)
                break
            stopper.checkpoint(step, model, tokenizer, recorder, result.eval_accuracy.get(step))
            for group in optimizer.param_groups:  # the learning-rate warm-up (cfg.warmup_steps)
                group["lr"] = cfg.lr_at(step)
            t_step = time.perf_counter()

            # 1. rollouts: G responses per problem from the engine
            problems = task.sample(n_prompts, rng)
            prompts = [tokenizer(p.prompt).input_ids for p in problems]
            batch = engine.generate([ids for ids in prompts for _ in range(cfg.group_size)], generator=rng)
            t_rollout = time.perf_counter() - t_step

            # 2. rewards and group advantages
            responses = decode_responses(tokenizer, batch)  # the engine's text
            batch = deliver(batch, cfg.engine, tokenizer=tokenizer, generator=rng)  # what the trainer receives
            owners = [p for p in problems for _ in range(cfg.group_size)]
            rewards = torch.tensor([task.reward(p, r) for p, r in zip(owners, responses, strict=True)])
            advantages = group_advantages(rewards, cfg.group_size, cfg.scale_advantages)  # (B,)
            first = (step * world.size + world.rank) * n_rows  # sample ids unique over ranks and steps
            sample_ids = torch.arange(first, first + n_rows)
            group_ids = sample_ids // cfg.group_size
            mask = batch.response_mask

            # 3. π_old: the trainer's recomputation at the same weights, logits / τ
            with torch.no_grad():
                old_logits = response_logits(model, batch, cfg.temperature).float()  # (B, T, V)
                old_logp = token_logp(old_logits, batch.response_ids)
                metrics.update(mismatch_metrics(batch, old_logits, old_logp))
                metrics["entropy/mean"] = masked_mean(entropy_from_logits(old_logits), mask)
                metrics["zero_adv_frac"] = ratio(int((mask & (advantages[:, None] == 0)).sum()), int(mask.sum()))
            del old_logits

            # 4.–5. minibatch updates under the rule, each recorded with every rule evaluated
            counter = BlockedCounter(rule_names)
            grad_norms: list[float] = []
            active_blocked: list[float] = []  # per update: blocked, A ≠ 0 tokens
            for epoch in range(cfg.epochs):
                order = torch.randperm(n_rows, generator=rng)
                for m, rows in enumerate(order.chunk(cfg.minibatches)):
                    mb = batch.select(rows)
                    logits = response_logits(model, mb, cfg.temperature).float()  # (b, T, V)
                    pi_logp = token_logp(logits, mb.response_ids)
                    with torch.no_grad():
                        topk_tv, topk_kl = topk_divergence(logits.detach(), mb.mu_topk_ids, mb.mu_topk_logp)
                        token_inputs = dict(
                            mu_logp=mb.mu_logp,
                            advantages=advantages[rows],
                            old_logp=old_logp[rows],
                            topk_tv=topk_tv,
                            topk_kl=topk_kl,
                        )
                    seed = (step, epoch * cfg.minibatches + m)  # the batch rules' draw: the recorded update
                    out = policy_loss(
                        cfg.rule,
                        seed=seed,
                        pi_logp=pi_logp,
                        response_mask=mb.response_mask,
                        low=low,
                        high=high,
                        clip_ratio_c=cfg.clip_ratio_c,
                        loss_agg_mode=cfg.loss_agg_mode,
                        **token_inputs,
                    )
                    optimizer.zero_grad(set_to_none=True)
                    out.loss.backward()
                    average_gradients(params)
                    grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)))
                    optimizer.step()

                    with torch.no_grad():
                        pi_logp = pi_logp.detach()
                        blocked = evaluate_all(
                            rules, pi_logp=pi_logp, response_mask=mb.response_mask, seed=seed, **token_inputs
                        )
                        counter.add(blocked, advantages[rows][:, None], mb.response_mask)
                        signed = mb.response_mask & (advantages[rows][:, None] != 0)
                        active_blocked += [float((out.blocked & signed).sum()), float(signed.sum())]
                        if recording:
                            recorder.record(
                                step,
                                update=epoch * cfg.minibatches + m,
                                token_ids=mb.response_ids,
                                response_mask=mb.response_mask,
                                pi_logp=pi_logp,
                                advantages=advantages[rows],
                                mu_logp=mb.mu_logp,
                                old_logp=old_logp[rows],
                                # π's logits before the temperature and μ's top-K, as users pass them:
                                # the recorder derives entropy, top-K TV/KL, pi_logp_raw and the masses
                                logits=logits.detach() * cfg.temperature,  # (b, T, V)
                                temperature=cfg.temperature,
                                mu_topk_ids=mb.mu_topk_ids,
                                mu_topk_logp=mb.mu_topk_logp,
                                **support_of(logits.detach(), mb.support),  # the engine's masks (top_p_mask)
                                blocked=blocked,  # the rule decisions, computed once above
                                sample_ids=sample_ids[rows],
                                group_ids=group_ids[rows],
                            )

            # 6. the engine serves the new weights
            engine.sync_weights(model)
            if evaluator is not engine:
                evaluator.sync_weights(model)

            step_time = time.perf_counter() - t_step
            lengths = batch.lengths().float()
            metrics.update(counter.metrics())
            metrics.update(
                {
                    "reward/mean": ratio(float(rewards.double().sum()), len(rewards)),
                    "reward/std": Pooled(
                        (len(rewards), float(rewards.double().sum()), float(rewards.double().square().sum())), std
                    ),
                    "response_length/mean": ratio(float(lengths.sum()), len(lengths)),
                    "grad_norm": sum(grad_norms) / len(grad_norms),  # the same on every rank
                    "blocked/active": Pooled(tuple(active_blocked), mean_of_ratios),
                    "time/step": step_time,
                    "time/rollout": t_rollout,
                }
            )
            if step % cfg.sample_every == 0:
                recorder.log_samples(
                    step,
                    prompts=[p.prompt for p in owners],
                    responses=responses,
                    rewards=rewards.tolist(),
                    advantages=advantages.tolist(),
                    lengths=lengths.long().tolist(),
                    sample_ids=sample_ids.tolist(),
                    group_ids=group_ids.tolist(),
                )
            logged = log_reduced(recorder, world, step, metrics)
            recorder.end_step(step)  # the live alerts judge the step now
            result.rewards.append(logged["reward/mean"])
            result.step_times.append(step_time)
            if bar is not None:
                bar.update(1)
                last = max(result.eval_accuracy, default=None)
                bar.set_postfix(
                    reward=f"{logged['reward/mean']:.2f}",
                    acc=f"{result.eval_accuracy[last]:.2f}" if last is not None else "-",
                    acc_sampled=f"{result.eval_accuracy_sampled[last]:.2f}" if last is not None else "-",
                    **alert_postfix(recorder.live_alerts),
                )
            if stopper.due(recorder):
                result.stopped, result.stopped_step = stopper.stop(step, recorder), step
                break
    if bar is not None:
        bar.close()
    return result


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    # no rate: the run's one speed figure is run_one's s/step at the end
    bar = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
    return tqdm(total=total, desc="train", unit="step", dynamic_ncols=True, bar_format=bar)
