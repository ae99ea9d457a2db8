"""A batch of sampled responses as the rollout engine delivers it to the trainer (`Rollout`): the
sequences, the response mask, and what the engine believed about every token (log μ and its top-K).
Both the engine (trustlens.train.rollout) and its planted defects (trustlens.train.engine_defects)
build on it, so it imports neither."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    """A batch of B sampled responses and what the engine believed about every token."""

    input_ids: torch.Tensor  # (B, P + T) long: left-padded prompt, then right-padded response
    attention_mask: torch.Tensor  # (B, P + T) long: 1 on real prompt and response tokens
    prompt_len: int  # P
    response_ids: torch.Tensor  # (B, T) long, pad_id after eos
    response_mask: torch.Tensor  # (B, T) bool: True on generated tokens, eos included
    mu_logp: torch.Tensor  # (B, T) float32: log μ(a_t), 0 on padding
    mu_topk_ids: torch.Tensor  # (B, T, K) long: μ's top-K ids, the sampled id forced in
    mu_topk_logp: torch.Tensor  # (B, T, K) float32: their log μ
    support: torch.Tensor | None = None  # (B, T, V) bool: the engine's sampling masks (`top_p_mask`), else None
    # (B, P + T, L, k) long: the engine's experts at every position (the input token's routing), −1 on
    # dense layers and where the engine never fed the position (the last token); None for a dense model
    routed_experts: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: torch.Tensor | slice) -> Rollout:
        """The sub-batch of rows `index` (a minibatch), same P and T."""
        return Rollout(
            input_ids=self.input_ids[index],
            attention_mask=self.attention_mask[index],
            prompt_len=self.prompt_len,
            response_ids=self.response_ids[index],
            response_mask=self.response_mask[index],
            mu_logp=self.mu_logp[index],
            mu_topk_ids=self.mu_topk_ids[index],
            mu_topk_logp=self.mu_topk_logp[index],
            support=None if self.support is None else self.support[index],
            routed_experts=None if self.routed_experts is None else self.routed_experts[index],
        )

    def lengths(self) -> torch.Tensor:
        """Response lengths in tokens, (B,) long."""
        return self.response_mask.sum(-1)


__all__ = ["Rollout"]
