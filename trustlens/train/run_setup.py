"""The setup of a built-in training run (trustlens.train.trainer): the policy and its warm start,
the task, the recorder, the engines and the optimizer, gathered in `TrainRun`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from trustlens.record import NullRecorder, TokenRecorder
from trustlens.record.args import distributed_rank
from trustlens.routing.replay import routers
from trustlens.run.aggregates import Keep
from trustlens.train.config import RANDOM_INIT, TrainConfig
from trustlens.train.rollout import RolloutEngine
from trustlens.train.tasks import ArithmeticTask
from trustlens.train.world import World, init_world


def load_policy(cfg: TrainConfig):
    """(model, tokenizer, meta) of the warm start of `cfg.model` (or `cfg.checkpoint`), or a random
    model when checkpoint == "random". Routing settings on a dense checkpoint raise ValueError."""
    from trustlens.train.model import MODELS, build_model, build_tokenizer, load_checkpoint

    if cfg.checkpoint == RANDOM_INIT:
        model, tokenizer = build_model(MODELS[cfg.model], seed=cfg.seed), build_tokenizer()
        meta = {"checkpoint": RANDOM_INIT}
    else:
        model, tokenizer, meta = load_checkpoint(cfg.checkpoint, cfg.model)
    if (cfg.routing_replay or cfg.routing_split_every) and not routers(model):
        raise ValueError(
            f"--routing-replay and --routing-split-every need a mixture-of-experts model, and checkpoint "
            f"{cfg.checkpoint} is dense: pass an MoE checkpoint or none with --model moe"
        )
    return model, tokenizer, meta


def task_of(meta: dict, cfg: TrainConfig) -> ArithmeticTask:
    """The task the warm start was trained on (its meta.json), with the run's partial credit."""
    trained_on = meta.get("config", {}).get("task", {})
    return ArithmeticTask(**{**trained_on, "partial_credit": cfg.partial_credit})


def make_recorder(cfg: TrainConfig, run_dir: Path | None, tokenizer, rules: dict, *, resume: bool = False):
    """The run's TokenRecorder (reopening the run in `run_dir` when `resume`), or a NullRecorder
    when nothing is to be written."""
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
        resume=resume,
    )


@dataclass
class TrainRun:
    """What every step of a run uses (built once by `_setup`)."""

    cfg: TrainConfig
    world: World
    rng: torch.Generator  # the run's draws: problems, sampling, delivery, minibatch order
    model: torch.nn.Module  # the trainer's float32 policy
    tokenizer: Any  # the task's PreTrainedTokenizerFast
    engine: RolloutEngine  # the rollout engine (its own precision, possibly stale)
    evaluator: RolloutEngine  # the engine that evaluates: `engine` unless it lags
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    task: ArithmeticTask
    eval_problems: list
    rules: dict  # rule -> (low, high) as evaluated
    n_prompts: int  # problems per rank per step
    n_rows: int  # responses per rank per step


def setup_run(cfg: TrainConfig) -> TrainRun:
    """The run's world, policy, engines, optimizer and task, from `cfg`."""
    world = init_world()
    torch.set_num_threads(cfg.threads)
    if cfg.prompts_per_step % world.size:
        raise ValueError(
            f"prompts_per_step ({cfg.prompts_per_step}) must be divisible by the world size ({world.size})"
        )
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
    task = task_of(meta, cfg)
    n_prompts = cfg.prompts_per_step // world.size
    return TrainRun(
        cfg=cfg,
        world=world,
        rng=rng,
        model=model,
        tokenizer=tokenizer,
        engine=engine,
        evaluator=evaluator,
        params=params,
        optimizer=torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay),
        task=task,
        eval_problems=task.eval_set(cfg.eval_size, seed=0),
        # the active rule with its thresholds, every other rule at its defaults (counterfactual)
        # but for the TV bound of the preset, if any
        rules=cfg.rule_thresholds(),
        n_prompts=n_prompts,
        n_rows=n_prompts * cfg.group_size,
    )


__all__ = ["TrainRun", "load_policy", "make_recorder", "setup_run", "task_of"]
