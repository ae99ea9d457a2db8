"""Supervised warm-up: teach the tiny model the task's format, then stop while it is still mediocre.

The model is trained by next-token cross-entropy on the scratchpad targets (prompt tokens are
not scored; the response and its ``<eos>`` are), plus for a mixture of experts the router's
load-balancing loss times `ModelConfig.router_aux_loss_coef` (transformers' Switch-style loss
E · Σ_e f_e · P_e over the MoE layers), on fresh training problems every step (never
from the eval pool). A share `alt_share` of the targets takes another valid path of the problem
(`Problem.solutions`, uniformly among the non-canonical ones), the rest the prompt's own order:
the other paths stay rare under the warm start, so RL meets low-μ tokens that are right.
Optimiser: AdamW at a constant learning rate after a linear ramp, the global gradient norm
clipped at 1.

Stopping rule: every `eval_every` steps the greedy accuracy on `eval_size` held-out problems is
measured (on ``eval_set(eval_size, seed=1)``); the first time it reaches `target_accuracy`
training stops (or at `max_steps`). The checkpoint's meta.json then records the greedy and the
sampled (temperature 1) accuracy on ``eval_set(final_eval_size, seed=0)``, the set the trainer
evaluates on. "Accuracy" is the mean task reward (1 for the right final answer). The default
target, 45% greedy, leaves RL room to improve: sampled accuracy is lower and the wrong sums are
near misses.

Everything is deterministic for a seed on one CPU machine (another machine's floating point may
differ): the model init, the problem draws, the eval draws and the sampled eval use their own
seeded generators, and torch runs on a fixed thread count.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from trustlens.train.model import (
    MODELS,
    WARM_STARTS,
    ModelConfig,
    build_model,
    build_tokenizer,
    count_parameters,
    save_checkpoint,
)
from trustlens.train.tasks import ArithmeticTask, Problem

IGNORE = -100  # label value that cross-entropy skips


@dataclass(frozen=True)
class WarmupConfig:
    """Settings of the supervised warm-up (the `trustlens warmup` flags)."""

    seed: int = 0  # seeds the model init, the training draws and the sampled eval
    max_steps: int = 3000  # hard cap on optimiser steps
    batch_size: int = 128  # problems per optimiser step
    lr: float = 2e-3  # AdamW learning rate after the ramp
    lr_ramp: int = 50  # steps of linear learning-rate ramp from 0
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    eval_every: int = 10  # steps between held-out accuracy checks
    eval_size: int = 256  # held-out problems per check (greedy)
    target_accuracy: float = 0.45  # stop at the first check whose greedy accuracy reaches this
    alt_share: float = 0.1  # share of training targets written along another valid path (rare paths)
    final_eval_size: int = 1000  # held-out problems for the accuracies written to meta.json
    threads: int = 1  # torch CPU threads (results are reproducible for a fixed value)
    model: ModelConfig = field(default_factory=ModelConfig)  # the model built and trained
    task: ArithmeticTask = field(default_factory=ArithmeticTask)  # the task trained on


def with_paths(problems: list[Problem], share: float, gen: torch.Generator, max_value: int = 999) -> list[Problem]:
    """`problems` whose `target` is, with probability `share` each, one of their other valid
    paths (uniform among them; problems with one path keep it). Draws 2·len(problems) numbers."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"alt_share: must be in [0, 1], got {share}")
    coin = torch.rand(len(problems), generator=gen).tolist()
    pick = torch.rand(len(problems), generator=gen).tolist()
    out = []
    for p, c, u in zip(problems, coin, pick, strict=True):
        others = p.solutions(max_value)[1:]
        out.append(replace(p, target=others[int(u * len(others))]) if c < share and others else p)
    return out


def batch_tensors(tokenizer, problems: list[Problem]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, labels), each (B, T): ``<bos> prompt target <eos>``, right-padded,
    labels = input ids on the response and its ``<eos>``, IGNORE on the prompt and padding."""
    texts = [f"{p.prompt} {p.target} {tokenizer.eos_token}" for p in problems]
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    prompt_lens = [len(tokenizer(p.prompt).input_ids) for p in problems]
    labels = enc.input_ids.masked_fill(enc.attention_mask == 0, IGNORE)
    for row, n in enumerate(prompt_lens):
        labels[row, :n] = IGNORE
    return enc.input_ids, enc.attention_mask, labels


@torch.no_grad()
def evaluate(
    model,
    tokenizer,
    task: ArithmeticTask,
    problems: list[Problem],
    temperature: float = 0.0,
    seed: int = 0,
    batch_size: int = 256,
) -> float:
    """Mean task reward of the model's responses to `problems` (the accuracy when rewards are 0/1).

    temperature 0 decodes greedily; otherwise tokens are sampled at `temperature` with a
    generator seeded by `seed` (the global torch RNG is left untouched). Responses are capped at
    the task's response length plus 4 tokens.
    """
    was_training = model.training
    model.eval()
    total = 0.0
    max_new = task.response_tokens + 4
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(problems), batch_size):
            chunk = problems[start : start + batch_size]
            enc = tokenizer([p.prompt for p in chunk], padding=True, padding_side="left", return_tensors="pt")
            if temperature > 0:
                sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
            else:
                sampling = dict(do_sample=False)
            out = model.generate(
                **enc,
                max_new_tokens=max_new,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                **sampling,
            )
            texts = tokenizer.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
            total += sum(task.reward(p, t) for p, t in zip(chunk, texts, strict=True))
    model.train(was_training)
    return total / max(len(problems), 1)


def warmup(cfg: WarmupConfig = WarmupConfig(), out: str | Path | None = None, progress: bool = True):
    """Train a fresh model by `cfg`; save it to `out` (if given) and return (model, tokenizer, meta)."""
    from tqdm import tqdm

    torch.set_num_threads(cfg.threads)
    tokenizer = build_tokenizer(cfg.task.max_value)
    if len(tokenizer) != cfg.model.vocab_size:
        raise ValueError(
            f"warmup: model vocab_size {cfg.model.vocab_size} != tokenizer size {len(tokenizer)} "
            f"(task.max_value={cfg.task.max_value})"
        )
    model = build_model(cfg.model, cfg.seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(cfg.lr_ramp, 1)))
    draws = torch.Generator().manual_seed(cfg.seed)
    checks = cfg.task.eval_set(cfg.eval_size, seed=1)

    started = time.perf_counter()
    accuracy, history, step = 0.0, [], 0
    bar = tqdm(total=cfg.max_steps, desc="warmup", unit="step", disable=not progress)
    while step < cfg.max_steps:
        problems = with_paths(cfg.task.sample(cfg.batch_size, draws), cfg.alt_share, draws, cfg.task.max_value)
        ids, mask, labels = batch_tensors(tokenizer, problems)
        routed = {"output_router_logits": True} if cfg.model.num_experts else {}  # adds the router's aux loss
        loss = model(input_ids=ids, attention_mask=mask, labels=labels, **routed).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        bar.update(1)
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            accuracy = evaluate(model, tokenizer, cfg.task, checks)
            history.append({"step": step, "loss": round(loss.item(), 4), "accuracy": accuracy})
            bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{accuracy:.2f}")
            if accuracy >= cfg.target_accuracy:
                break
    bar.close()

    model.eval()
    final = cfg.task.eval_set(cfg.final_eval_size, seed=0)
    meta = {
        "made_by": "trustlens warmup",
        "config": _jsonable(cfg),
        "steps": step,
        "reached_target": accuracy >= cfg.target_accuracy,
        "parameters": count_parameters(model),
        "train_seconds": round(time.perf_counter() - started, 1),
        "eval": {"problems": cfg.final_eval_size, "eval_set_seed": 0},
        "accuracy_greedy": evaluate(model, tokenizer, cfg.task, final),
        "accuracy_sampled_t1": evaluate(model, tokenizer, cfg.task, final, temperature=1.0, seed=cfg.seed),
        "history": history,
        "torch_version": torch.__version__,
    }
    if out is not None:
        save_checkpoint(model, tokenizer, out, meta)
    return model, tokenizer, meta


def _jsonable(cfg: WarmupConfig) -> dict:
    return {**asdict(cfg), "task": task_dict(cfg.task)}


def task_dict(task: ArithmeticTask) -> dict:
    """The task's public settings; `ArithmeticTask(**d)` rebuilds it, also after a JSON round trip."""
    return {k: v for k, v in asdict(task).items() if not k.startswith("_")}


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """Flags of `trustlens warmup` (every WarmupConfig field a user would change)."""
    d = WarmupConfig()
    parser.description = (
        "Build the warm-start checkpoint: train the tiny model on the arithmetic task's "
        "scratchpad targets until its greedy held-out accuracy first reaches --target-accuracy, "
        "then write model.safetensors, config.json, tokenizer.json and meta.json to --out. "
        "Deterministic for a seed and --threads on one machine."
    )
    parser.add_argument(
        "--model",
        choices=list(MODELS),
        default="dense",
        help="the model trained: dense (Llama) or moe (Qwen3-MoE, 8 experts, top-2) (default dense)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: the shipped data/warmstart, data/warmstart_moe with --model moe)",
    )
    parser.add_argument(
        "--seed", type=int, default=d.seed, help=f"seed of model init, data and sampled eval (default {d.seed})"
    )
    parser.add_argument(
        "--max-steps", type=int, default=d.max_steps, help=f"cap on optimiser steps (default {d.max_steps})"
    )
    parser.add_argument(
        "--batch-size", type=int, default=d.batch_size, help=f"problems per step (default {d.batch_size})"
    )
    parser.add_argument("--lr", type=float, default=d.lr, help=f"AdamW learning rate (default {d.lr})")
    parser.add_argument(
        "--target-accuracy",
        type=float,
        default=d.target_accuracy,
        help=f"stop once greedy held-out accuracy reaches this (default {d.target_accuracy})",
    )
    parser.add_argument(
        "--alt-share",
        type=float,
        default=d.alt_share,
        help=f"share of training targets written along another valid path (default {d.alt_share})",
    )
    parser.add_argument(
        "--eval-every", type=int, default=d.eval_every, help=f"steps between accuracy checks (default {d.eval_every})"
    )
    parser.add_argument(
        "--eval-size", type=int, default=d.eval_size, help=f"held-out problems per check (default {d.eval_size})"
    )
    parser.add_argument(
        "--final-eval-size",
        type=int,
        default=d.final_eval_size,
        help=f"held-out problems for the accuracies in meta.json (default {d.final_eval_size})",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=d.threads,
        help=f"torch CPU threads; fix it to reproduce a checkpoint (default {d.threads})",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from trustlens.paths import data_path

    for flag in ("max_steps", "batch_size", "eval_every", "eval_size", "final_eval_size", "threads"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')}: must be >= 1, got {getattr(args, flag)}")
    if not 0.0 < args.target_accuracy <= 1.0:
        raise ValueError(f"--target-accuracy: must be in (0, 1], got {args.target_accuracy}")
    if not 0.0 <= args.alt_share <= 1.0:
        raise ValueError(f"--alt-share: must be in [0, 1], got {args.alt_share}")
    if args.lr <= 0:
        raise ValueError(f"--lr: must be > 0, got {args.lr}")
    cfg = WarmupConfig(
        seed=args.seed,
        max_steps=args.max_steps,
        batch_size=args.batch_size,
        lr=args.lr,
        target_accuracy=args.target_accuracy,
        alt_share=args.alt_share,
        eval_every=args.eval_every,
        eval_size=args.eval_size,
        final_eval_size=args.final_eval_size,
        threads=args.threads,
        model=MODELS[args.model],
    )
    out = args.out if args.out is not None else data_path(WARM_STARTS[args.model])
    _, _, meta = warmup(cfg, out, progress=not args.quiet)
    print(
        f"warmup: {meta['steps']} steps in {meta['train_seconds']} s; held-out accuracy "
        f"greedy {meta['accuracy_greedy']:.3f}, sampled {meta['accuracy_sampled_t1']:.3f}; wrote {out}"
    )
    if not meta["reached_target"]:
        print(f"warmup: warning: stopped at --max-steps before reaching --target-accuracy {cfg.target_accuracy}")
    return 0
