"""A TRL `rollout_func` that samples with trustlens' own rollout engine, so that a TRL run
without vLLM still has sampling log-probabilities μ (see `engine_rollout`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


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
