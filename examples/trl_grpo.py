"""TRL's GRPOTrainer recorded by trustlens: swap the class, add `trustlens_dir`.

A tiny Llama built from scratch learns a toy task (prompts are two numbers; the reward is the
share of response words that are numbers above 50) with TRL's GRPO on the CPU. With
`--engine bf16` (the default) a bf16 copy of the policy samples the completions and hands TRL
its log-probabilities, so the run records μ and a real training–inference mismatch; with
`--engine none` TRL generates itself and μ is null (the rules are anchored on π_old).

    python examples/trl_grpo.py --out runs/trl
    python -m torch.distributed.run --nproc_per_node 2 examples/trl_grpo.py --out runs/trl_ddp

Under torchrun every process records its own shard of the same run directory.
"""

from __future__ import annotations

import argparse
import os
import random

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental

import torch
from datasets import Dataset
from trl import GRPOConfig

from trustlens.integrations.trl import TrustLensGRPOTrainer, engine_rollout
from trustlens.train.model import ModelConfig, build_model, build_tokenizer


def above_50(completions: list[str], **kwargs) -> list[float]:
    """The reward: the share of response words that are numbers above 50."""
    shares = []
    for text in completions:
        words = text.split()
        shares.append(sum(w.isdigit() and int(w) > 50 for w in words) / max(len(words), 1))
    return shares


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="run directory to create")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (TRL max_steps)")
    p.add_argument(
        "--engine",
        choices=["bf16", "fp32", "none"],
        default="bf16",
        help="precision of the sampling copy; none: TRL generates (no μ)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed")
    args = p.parse_args()
    torch.set_num_threads(1)

    tok = build_tokenizer(max_number=99)
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    rng = random.Random(args.seed)
    prompts = [f"{rng.randrange(100)} {rng.randrange(100)}" for _ in range(64)]
    config = GRPOConfig(
        output_dir=f"{args.out}-trl",
        per_device_train_batch_size=4,
        num_generations=4,
        steps_per_generation=2,  # two optimizer steps per generation: π moves away from π_old
        max_completion_length=8,
        max_steps=args.steps,
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        seed=args.seed,
    )
    trainer = TrustLensGRPOTrainer(
        model=build_model(cfg, seed=args.seed),
        processing_class=tok,
        reward_funcs=above_50,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        rollout_func=None if args.engine == "none" else engine_rollout(args.engine),
        trustlens_dir=args.out,
    )
    trainer.train()
    print(f"recorded {args.out}")


if __name__ == "__main__":
    main()
