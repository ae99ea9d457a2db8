"""The built-in DPPO training run on this CPU.

- `trustlens.train.tasks`: the arithmetic task (`ArithmeticTask`, `Problem`, the reward).
- `trustlens.train.model`: the word-level tokenizer, the tiny Llama policy, checkpoints.
- `trustlens.train.warmup`: the supervised warm-up that makes the shipped warm-start checkpoint
  (``trustlens warmup``).
- `trustlens.train.rollout`, `trustlens.train.trainer`: the rollout engine and the GRPO/DPPO trainer.
- `trustlens.train.rollout_batch`: `Rollout`, the batch the engine delivers to the trainer.
- `trustlens.train.step_metrics`: the per-step mismatch (μ vs π_old) and block-rate metrics.
- `trustlens.train.engine_defects`: the log-probability bugs ``--engine`` plants in the rollout
  engine (raw log-probs, top-p renormalised, shifted, sentinels, other token ids).
- `trustlens.train.commands`: the ``train``/``compare``/``claims``/``demo``/``make-sample`` commands'
  flags and ``train``; `trustlens.train.runner` trains one run for them, `trustlens.train.runsets`
  holds ``compare`` and ``claims``, `trustlens.train.sample` ``demo`` and ``make-sample``.

Submodules import torch; import them directly (this package imports nothing eagerly).
"""
