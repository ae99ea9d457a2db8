"""Held-out evaluation of the built-in run: the share of held-out problems the policy answers
right, greedy and sampled, summed over ranks."""

from __future__ import annotations

import math

import torch

from trustlens.train.rollout import Rollout, RolloutEngine
from trustlens.train.tasks import ArithmeticTask, Problem
from trustlens.train.world import World, all_reduce_


def decode_responses(tokenizer, batch: Rollout) -> list[str]:
    """Each response's text, special tokens such as <eos> kept visible."""
    return [tokenizer.decode(ids[m].tolist()) for ids, m in zip(batch.response_ids, batch.response_mask, strict=True)]


@torch.no_grad()
def evaluate_accuracy(
    engine: RolloutEngine, tokenizer, task: ArithmeticTask, problems: list[Problem], world: World
) -> dict[str, float]:
    """Share of held-out problems answered right, over all ranks' shares of `problems`:

    eval/accuracy          greedy decoding (the policy's mode)
    eval/accuracy_sampled  one response per problem sampled at τ, from a fixed seed at every
                           evaluation (common random numbers, so steps compare with less noise):
                           the policy's expected held-out accuracy, what RL optimises
    """
    mine = problems[world.rank :: world.size]
    prompts = [tokenizer(p.prompt).input_ids for p in mine]
    correct = torch.zeros(3, dtype=torch.float64)  # greedy, sampled, problems
    if mine:
        greedy = engine.generate(prompts, greedy=True)
        sampled = engine.generate(prompts, generator=torch.Generator().manual_seed(world.rank))
        for i, batch in enumerate((greedy, sampled)):
            correct[i] = sum(
                task.reward(p, r) == 1.0 for p, r in zip(mine, decode_responses(tokenizer, batch), strict=True)
            )
        correct[2] = len(mine)
    all_reduce_(correct, "sum")
    shares = (correct[:2] / correct[2]).tolist() if correct[2] else [math.nan, math.nan]
    return {"eval/accuracy": shares[0], "eval/accuracy_sampled": shares[1]}


__all__ = ["decode_responses", "evaluate_accuracy"]
