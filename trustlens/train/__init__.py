"""The built-in DPPO training run on this CPU.

- `trustlens.train.tasks`: the arithmetic task (`ArithmeticTask`, `Problem`, the reward).
- `trustlens.train.model`: the word-level tokenizer, the tiny Llama policy, checkpoints.
- `trustlens.train.warmup`: the supervised warm-up that makes the shipped warm-start checkpoint
  (``trustlens warmup``).
- `trustlens.train.rollout`, `trustlens.train.trainer`, `trustlens.train.commands`: the rollout
  engine, the GRPO/DPPO trainer and the ``train``/``compare``/``demo`` commands.

Submodules import torch; import them directly (this package imports nothing eagerly).
"""
