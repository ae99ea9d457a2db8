"""What a `TokenRecorder.record` call derives from π's logits, at the valid positions only:

- entropy: H(π) = −Σ_v π_v log π_v of π = softmax(logits / τ), nats (`entropy_from_logits`);
- topk_tv, topk_kl: TV(μ, π) and KL(μ ‖ π) over μ's top-K ids plus one bucket for the rest of the
  vocabulary, KL in nats (`topk_divergence`, docs/rules.md).

The logits are gathered a chunk of about LOGIT_CHUNK_ELEMENTS (rows × vocabulary) at a time, so
that no (N, V) copy of the valid rows is made.
"""

from __future__ import annotations

import math

import torch

from trustlens.divergence import entropy_from_logits, topk_divergence
from trustlens.record.args import check_tensor_shape, id_tensor
from trustlens.record.token_rows import check_token_range

# logits are processed in gathered chunks of about this many elements (rows × vocabulary)
LOGIT_CHUNK_ELEMENTS = 1 << 24


def logit_quantities(
    logits: object,  # (B, T, V) π's logits, divided by `temperature` here
    mask: torch.Tensor,  # (B, T) bool: True at the valid positions
    ids: torch.Tensor,  # (B, T) int: the sampled ids
    topk_ids: object,  # (B, T, K) μ's top-K ids, sampled id included; None: no top-K
    topk_logp: object,  # (B, T, K) their log μ; None with topk_ids
    temperature: float,  # the rollout's sampling temperature τ
    *,
    want_entropy: bool,
) -> dict[str, torch.Tensor]:  # name -> (B, T)
    """{"entropy": …, "topk_tv": …, "topk_kl": …} (B, T), 0 in the padding: the entropy (when
    `want_entropy`) and the top-K TV/KL (when μ's top-K is given) at the valid positions, in
    float32 (float64 when the logits are). `ids` are checked here against the vocabulary at the
    valid positions; a bad argument is a ValueError naming it (and the (b, t) of a bad value)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(mask.shape):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a (B, T, V) tensor with (B, T) = {tuple(mask.shape)}, got {got}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got dtype {logits.dtype}")
    vocab = logits.shape[-1]
    check_token_range(ids, mask, vocab, " (the vocabulary of logits)")
    index = torch.nonzero(mask.reshape(-1))[:, 0]  # (N,) the valid positions, flat
    topk: tuple[torch.Tensor, torch.Tensor] | None = None  # (N, K) μ's top-K ids and log μ, valid positions
    if topk_ids is not None:
        k = topk_ids.shape[-1] if isinstance(topk_ids, torch.Tensor) and topk_ids.dim() == 3 else -1
        checked_ids = id_tensor("mu_topk_ids", topk_ids, (*mask.shape, k))
        check_tensor_shape("mu_topk_logp", topk_logp, (*mask.shape, k))
        assert isinstance(topk_logp, torch.Tensor), "checked by check_tensor_shape"
        topk = (
            checked_ids.to(mask.device).reshape(-1, k).index_select(0, index),
            topk_logp.to(mask.device).reshape(-1, k).index_select(0, index),
        )
    wanted = (["entropy"] if want_entropy else []) + (["topk_tv", "topk_kl"] if topk is not None else [])
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    out = {name: torch.zeros(mask.numel(), dtype=dtype, device=mask.device) for name in wanted}  # (B·T,)
    flat = logits.reshape(-1, vocab)
    rows = max(1, LOGIT_CHUNK_ELEMENTS // vocab)
    for start in range(0, len(index), rows):
        chunk_index = index[start : start + rows]
        chunk = flat.index_select(0, chunk_index)  # (n, V)
        where = f"at the valid positions from (b, t) = {divmod(int(chunk_index[0]), mask.shape[1])} on"
        if want_entropy:
            bad = torch.isnan(chunk) | (chunk == math.inf)
            if bool(bad.any()):
                row = int(chunk_index[torch.nonzero(bad.any(-1))[0, 0]])
                raise ValueError(f"logits hold NaN or +inf at (b, t) = {divmod(row, mask.shape[1])}")
            out["entropy"][chunk_index] = entropy_from_logits(chunk, temperature=temperature).to(dtype)
        if topk is not None:
            sl = slice(start, start + rows)
            try:
                chunk_tv, chunk_kl = topk_divergence(chunk, topk[0][sl], topk[1][sl], temperature=temperature)
            except ValueError as err:
                raise ValueError(f"{err} ({where}; index counted over them)") from err
            out["topk_tv"][chunk_index] = chunk_tv.to(dtype)
            out["topk_kl"][chunk_index] = chunk_kl.to(dtype)
    return {name: t.reshape(mask.shape) for name, t in out.items()}
