"""Divergences between the rollout policy μ and the trained policy π, per token (docs/rules.md).

- `measures`: binary and top-K TV and KL, the math in log space (its docstring states every
  formula and unit); `full_vocab`: the exact TV and KL, the entropy and μ's top-K from logits,
  over every token; `arguments`: the argument checks they share.
- `vocab_chunks`: the passes over the vocabulary that never build a (N, V) log-softmax.
- `kernels`: one pass over π's logits on CUDA (a Triton kernel, or its torch reference), which
  the functions here use for CUDA tensors; the CPU keeps the chunked passes.
"""

from trustlens.divergence.full_vocab import (
    ENTROPY_CHUNK_ELEMENTS,
    entropy_from_logits,
    exact_divergence,
    token_logp,
    topk_from_logits,
)
from trustlens.divergence.measures import (
    binary_kl,
    binary_tv,
    bucket_divergence,
    force_sampled,
    log1mexp,
    topk_buckets,
    topk_divergence,
    topk_divergence_from_logp,
    topk_mass,
)

__all__ = [
    "ENTROPY_CHUNK_ELEMENTS",
    "binary_kl",
    "binary_tv",
    "bucket_divergence",
    "entropy_from_logits",
    "exact_divergence",
    "force_sampled",
    "log1mexp",
    "token_logp",
    "topk_buckets",
    "topk_divergence",
    "topk_divergence_from_logp",
    "topk_from_logits",
    "topk_mass",
]
