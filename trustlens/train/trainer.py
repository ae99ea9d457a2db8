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
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trustlens.divergence import entropy_from_logits, token_logp, topk_divergence
from trustlens.record import NullRecorder
from trustlens.rules import evaluate_all
from trustlens.rules.loss import policy_loss
from trustlens.train.config import TrainConfig
from trustlens.train.engine_defects import (
    deliver,
    resumed_after,
    sequence_weight,
    support_of,
    weighted_advantages,
)
from trustlens.train.evaluate import decode_responses, evaluate_accuracy
from trustlens.train.pooled import (
    Pooled,
    log_reduced,
    masked_mean,
    mean_of_ratios,
    ratio,
    std,
)
from trustlens.train.progress import progress_bar, show_step
from trustlens.train.rollout_batch import Rollout
from trustlens.train.routed import (
    RoutedPass,
    flip_metrics,
    policy_logits,
    routing_record_kwargs,
    shadow_split,
    split_metrics,
)
from trustlens.train.run_setup import TrainRun, load_policy, make_recorder, setup_run
from trustlens.train.step_metrics import BlockedCounter, mismatch_metrics
from trustlens.train.stopping import AlertStop
from trustlens.train.world import average_gradients


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


# ---------------------------------------------------------------------------------------------
# The run.


@dataclass
class _Batch:
    """One step's rollouts as the trainer uses them."""

    batch: Rollout  # what the trainer receives (after a planted delivery defect)
    responses: list[str]  # the engine's text
    owners: list  # the problem of each response
    rewards: torch.Tensor  # (B,)
    advantages: torch.Tensor  # (B,)
    sample_ids: torch.Tensor  # (B,) unique over ranks and steps
    group_ids: torch.Tensor  # (B,)
    t_rollout: float = 0.0  # seconds of the rollouts


def train(cfg: TrainConfig, run_dir: str | Path | None, *, progress: bool = True) -> TrainResult:
    """Run `cfg` and record it into `run_dir` (see the module docstring). Returns the curves."""
    run = setup_run(cfg)
    run_dir = Path(run_dir) if run_dir is not None and cfg.record else None
    result = TrainResult(run_dir)
    bar = progress_bar(cfg.steps, progress and run.world.main)
    stopper = AlertStop(cfg.stop_on, cfg.checkpoint_every, cfg.keep_checkpoints, run_dir, run.world, cfg.eval_size)
    restart_at = resumed_after(cfg.steps) + 1 if cfg.engine == "resume" else None
    with ExitStack() as stack:
        recorder = stack.enter_context(make_recorder(cfg, run_dir, run.tokenizer, run.rules))
        for step in range(cfg.steps + 1):
            if step == restart_at:
                recorder = stack.enter_context(_restart(run, recorder, run_dir))
            metrics: dict[str, float | Pooled] = {}
            if cfg.eval_size and (step % cfg.eval_every == 0 or step == cfg.steps):
                _evaluate(run, step, metrics, result)
            if step == cfg.steps:  # the last pass only evaluates the final weights
                log_reduced(recorder, run.world, step, metrics)
                break
            stopper.checkpoint(step, run.model, run.tokenizer, recorder, result.eval_accuracy.get(step))
            for group in run.optimizer.param_groups:  # the learning-rate warm-up (cfg.warmup_steps)
                group["lr"] = cfg.lr_at(step)
            logged, step_time = _train_step(run, step, recorder, metrics)
            result.rewards.append(logged["reward/mean"])
            result.step_times.append(step_time)
            if bar is not None:
                show_step(bar, logged, result.eval_accuracy, result.eval_accuracy_sampled, recorder.live_alerts)
            if stopper.due(recorder):
                result.stopped, result.stopped_step = stopper.stop(step, recorder), step
                break
    if bar is not None:
        bar.close()
    return result


def _restart(run: TrainRun, recorder, run_dir: Path | None):
    """The `resume` defect's restart before the first step of the run's second half: the recorder
    ends and the run is reopened with resume=True (run.json `resumed_after`), the trainer goes on
    from its state (what a reload of its checkpoint gives), and the engine restarts from the warm
    start (`RolloutEngine.restart`). Returns the reopened recorder."""
    recorder.close()
    start, _, _ = load_policy(run.cfg)
    run.engine.restart(start, run.model)
    return make_recorder(run.cfg, run_dir, run.tokenizer, run.rules, resume=True)


def _evaluate(run: TrainRun, step: int, metrics: dict, result: TrainResult) -> None:
    t = time.perf_counter()
    accuracy = evaluate_accuracy(run.evaluator, run.tokenizer, run.task, run.eval_problems, run.world)
    result.eval_accuracy[step] = accuracy["eval/accuracy"]
    result.eval_accuracy_sampled[step] = accuracy["eval/accuracy_sampled"]
    metrics.update({**accuracy, "time/eval": time.perf_counter() - t})


def _train_step(run: TrainRun, step: int, recorder, metrics: dict) -> tuple[dict[str, float], float]:
    """Steps 1–7 of the module docstring; returns the logged (reduced) metrics and the step's seconds."""
    cfg = run.cfg
    t_step = time.perf_counter()
    data = _rollouts(run, step)
    old_logp, mu_routes = _old_pass(run, step, data, metrics)

    # 4.–5. minibatch updates under the rule, each recorded with every rule evaluated
    counter = BlockedCounter(list(run.rules))
    grad_norms: list[float] = []
    active_blocked: list[float] = []  # per update: blocked, A ≠ 0 tokens
    for epoch in range(cfg.epochs):
        order = torch.randperm(run.n_rows, generator=run.rng)
        for m, rows in enumerate(order.chunk(cfg.minibatches)):
            update = epoch * cfg.minibatches + m
            blocked, signed, grad_norm = _update(run, step, update, data, rows, recorder, old_logp, mu_routes)
            counter.add(blocked, data.advantages[rows][:, None], data.batch.response_mask[rows])
            active_blocked += signed
            grad_norms.append(grad_norm)

    # 6. the engine serves the new weights
    run.engine.sync_weights(run.model)
    if run.evaluator is not run.engine:
        run.evaluator.sync_weights(run.model)

    step_time = time.perf_counter() - t_step
    rewards = data.rewards
    lengths = data.batch.lengths().float()
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
            "time/rollout": data.t_rollout,
        }
    )
    if step % cfg.sample_every == 0:
        recorder.log_samples(
            step,
            prompts=[p.prompt for p in data.owners],
            responses=data.responses,
            rewards=rewards.tolist(),
            advantages=data.advantages.tolist(),
            lengths=lengths.long().tolist(),
            sample_ids=data.sample_ids.tolist(),
            group_ids=data.group_ids.tolist(),
        )
    logged = log_reduced(recorder, run.world, step, metrics)
    recorder.end_step(step)  # the live alerts judge the step now
    return logged, step_time


def _rollouts(run: TrainRun, step: int) -> _Batch:
    """Steps 1–2: G responses per problem from the engine, their rewards and group advantages."""
    cfg, world = run.cfg, run.world
    t = time.perf_counter()
    problems = run.task.sample(run.n_prompts, run.rng)
    prompts = [run.tokenizer(p.prompt).input_ids for p in problems]
    batch = run.engine.generate([ids for ids in prompts for _ in range(cfg.group_size)], generator=run.rng)
    t_rollout = time.perf_counter() - t
    responses = decode_responses(run.tokenizer, batch)  # the engine's text
    batch = deliver(batch, cfg.engine, tokenizer=run.tokenizer, generator=run.rng)  # what the trainer receives
    owners = [p for p in problems for _ in range(cfg.group_size)]
    rewards = torch.tensor([run.task.reward(p, r) for p, r in zip(owners, responses, strict=True)])
    first = (step * world.size + world.rank) * run.n_rows  # sample ids unique over ranks and steps
    sample_ids = torch.arange(first, first + run.n_rows)
    return _Batch(
        batch=batch,
        responses=responses,
        owners=owners,
        rewards=rewards,
        advantages=group_advantages(rewards, cfg.group_size, cfg.scale_advantages),  # (B,)
        sample_ids=sample_ids,
        group_ids=sample_ids // cfg.group_size,
        t_rollout=t_rollout,
    )


@torch.no_grad()
def _old_pass(run: TrainRun, step: int, data: _Batch, metrics: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Step 3, π_old: the trainer's recomputation at the same weights, logits / τ (with μ's routing
    under --routing-replay), and the mismatch metrics; for a mixture of experts the routing
    metrics, and every --routing-split-every steps the shadow forward's split. Returns
    (log π_old (B, T), μ's (B, T, L, k) experts or None for a dense model)."""
    cfg, batch = run.cfg, data.batch
    mask = batch.response_mask
    old_logits, routed = policy_logits(run.model, batch, cfg.temperature, replay=cfg.routing_replay)
    old_logits = old_logits.float()  # (B, T, V)
    old_logp = token_logp(old_logits, batch.response_ids)
    metrics.update(mismatch_metrics(batch, old_logits, old_logp))
    metrics["entropy/mean"] = masked_mean(entropy_from_logits(old_logits), mask)
    metrics["zero_adv_frac"] = ratio(int((mask & (data.advantages[:, None] == 0)).sum()), int(mask.sum()))
    del old_logits
    if routed is None or batch.routed_experts is None:
        return old_logp, None
    mu_routes = batch.routed_experts[:, batch.prompt_len - 1 : -1]  # (B, T, L, k)
    live = None if cfg.routing_replay else routed.experts
    if cfg.routing_split_every and step % cfg.routing_split_every == 0:
        split, shadow_live = shadow_split(run.model, batch, cfg.temperature, old_logp, replay=cfg.routing_replay)
        live = routed.experts if shadow_live is None else shadow_live
        metrics.update(split_metrics(split, mask))
    if live is not None:
        metrics.update(flip_metrics(mu_routes, live, mask))
    return old_logp, mu_routes


def _update(
    run: TrainRun,
    step: int,
    update: int,
    data: _Batch,
    rows: torch.Tensor,
    recorder,
    old_logp: torch.Tensor,  # (B, T) log π_old of the whole batch
    mu_routes: torch.Tensor | None,  # (B, T, L, k) the engine's experts, None for a dense model
) -> tuple[dict[str, torch.Tensor], list[float], float]:
    """One optimizer update on minibatch `rows`, recorded: (every rule's blocked (b, T) tokens,
    [blocked A ≠ 0 tokens, A ≠ 0 tokens] of the active rule, the gradient norm)."""
    cfg = run.cfg
    low, high = run.rules[cfg.rule]
    mb = data.batch.select(rows)
    advantages = data.advantages[rows]
    summed = cfg.engine == "sequence_sum"  # the defect's sequence weight (b,), as it computes it
    seq_weight = sequence_weight(mb.mu_logp, old_logp[rows], mb.response_mask) if summed else None
    logits, routed = policy_logits(run.model, mb, cfg.temperature, replay=cfg.routing_replay)
    logits = logits.float()  # (b, T, V)
    pi_logp = token_logp(logits, mb.response_ids)
    with torch.no_grad():
        topk_tv, topk_kl = topk_divergence(logits.detach(), mb.mu_topk_ids, mb.mu_topk_logp)
        token_inputs = dict(
            mu_logp=mb.mu_logp,
            advantages=advantages,
            old_logp=old_logp[rows],
            topk_tv=topk_tv,
            topk_kl=topk_kl,
        )
    seed = (step, update)  # the batch rules' draw: the recorded update
    out = policy_loss(
        cfg.rule,
        seed=seed,
        pi_logp=pi_logp,
        response_mask=mb.response_mask,
        low=low,
        high=high,
        clip_ratio_c=cfg.clip_ratio_c,
        loss_agg_mode=cfg.loss_agg_mode,
        **token_inputs | {"advantages": weighted_advantages(advantages, seq_weight)},
    )
    run.optimizer.zero_grad(set_to_none=True)
    _loss(out.loss, routed, run.model).backward()
    average_gradients(run.params)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(run.params, cfg.grad_clip))
    run.optimizer.step()

    with torch.no_grad():
        pi_logp = pi_logp.detach()
        blocked = evaluate_all(run.rules, pi_logp=pi_logp, response_mask=mb.response_mask, seed=seed, **token_inputs)
        signed = mb.response_mask & (advantages[:, None] != 0)
        if not isinstance(recorder, NullRecorder):
            recorder.record(
                step,
                update=update,
                token_ids=mb.response_ids,
                response_mask=mb.response_mask,
                pi_logp=pi_logp,
                advantages=advantages,
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
                sample_ids=data.sample_ids[rows],
                group_ids=data.group_ids[rows],
                seq_weight=None if seq_weight is None else seq_weight[:, None].expand_as(pi_logp),
                **routing_record_kwargs(
                    None if mu_routes is None else mu_routes[rows],
                    None if routed is None else routed.experts,
                ),
            )
    return blocked, [float((out.blocked & signed).sum()), float(signed.sum())], grad_norm


def _loss(policy: torch.Tensor, routed: RoutedPass | None, model: torch.nn.Module) -> torch.Tensor:
    """The training loss: the policy loss, plus the router's load-balancing loss times the model's
    router_aux_loss_coef for a mixture of experts."""
    if routed is None:
        return policy
    config: Any = model.config
    return policy + config.router_aux_loss_coef * routed.aux_loss
