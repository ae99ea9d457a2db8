"""Log-probability bugs of a rollout engine, planted on purpose: `trustlens train --engine DEFECT`.

Each defect is one that real RL stacks have shipped (issue trackers of vLLM, TRL, SGLang,
ms-swift): the μ the trainer receives is not the distribution the tokens were sampled from, so
the importance ratio π/μ and every μ-anchored rule see a mismatch that is a bug, not numerical
drift. The defect changes what the trainer uses, as it would in a real stack, so it can change
learning (docs/train.md, "Engine defects").

Two places of the engine:

- while sampling (`engine_token`, called by `RolloutEngine.generate` for every position):
  ``raw_logprobs`` samples at τ but reports log μ = log softmax(logits), the log-probs before the
  temperature (vLLM V1's default `logprobs_mode="raw_logprobs"`); ``top_p`` samples with nucleus
  sampling at p = TOP_P and reports μ renormalised over the kept tokens (μ of a dropped id is 0:
  log μ = −inf in the top-K); ``top_p_mask`` does the same and hands the trainer the engine's
  sampling masks (vLLM's `return_sampling_mask`), which the trainer records as π's mass on the
  support (`pi_support_mass`) without applying them to π: the ratio carries log S exactly;
- when the rollout reaches the trainer (`deliver`, after the rewards were computed on the
  engine's own text): ``shifted`` gives position t the log μ of position t − 1 within each
  response (the first keeps its own); ``sentinel`` writes log μ = 0.0 at a share SENTINEL_SHARE of
  the response tokens, drawn at random, as padding code does where the log-prob is unknown;
  ``token_ids`` hands the trainer the id of ``<unk>`` wherever the engine sampled the step
  separator ``;`` (a vocabulary mismatch between engine and trainer, about 13% of the tokens of a
  response; μ's top-K ids are mapped the same way): the trainer computes π_old and π on ids that μ
  never scored.

And in its kernels: ``batch_variant`` is an engine that is not batch-invariant. It decodes the B
sequences in engine batches of at most MAX_SEQS, and on a partial batch (the last B mod MAX_SEQS
rows) its output layer runs as a split-K GEMM: logits = Σ over SPLITS chunks of the hidden size
of h_c · W_cᵀ (`split_k_hook`), as kernels that choose their reduction by the batch size do. The
same logits up to float32 rounding, so log μ of those rows differs from π_old in the last bits:
the tokens are sampled from those logits, so μ is still the distribution sampled from, but an
engine that should be zero-mismatch (``--rollout-precision fp32_exact``) is not, and only on
some rows of the batch (`trustlens certify` names them).

At the engine's weights (`RolloutEngine.sync_weights`): ``frozen_policy`` adds an adapter's
logit delta (a fixed offset per token id, `merged_offset`) again at every weight sync, as an
engine that merges a LoRA adapter into weights that already hold it does: with lr 0 the trainer's
policy stays where it is while the engine's moves away from it, sync after sync. ``resume``
restarts the run halfway (after step `resumed_after(steps)`: the recorder reopens the run with
resume=True, so run.json holds the resume point; the trainer goes on from its state, as a reload
of its own checkpoint gives). The restarted engine loads the warm start, not the resumed weights,
and receives every later sync as a delta to what it holds (`RolloutEngine.restart`): it serves
θ + (θ_0 − θ_r) from then on, behind the trainer by what the first half trained (slime #1695).

And one of the trainer's own: ``sequence_sum`` weights each response by a sequence-level
importance weight of π_old/μ whose log sums the token log-ratios where GSPO and sequence IS take
their mean (`sequence_weight`; trl #5814), and records the weight it computed as `seq_weight`.

``clean`` is the engine as it is without `--engine`: these functions then do exactly what the
engine did before they existed (bit-identical runs).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from trustlens.divergence import token_logp, topk_from_logits
from trustlens.train.defect_names import ENGINE_DEFECTS, check_defect
from trustlens.train.rollout_batch import Rollout

TOP_P = 0.8  # nucleus mass of the `top_p` and `top_p_mask` defects
TRUNCATING = ("top_p", "top_p_mask")  # the defects that sample from the top-p nucleus
SENTINEL_SHARE = 0.1  # share of response tokens whose log μ the `sentinel` defect writes as 0.0
SENTINEL = 0.0  # the value it writes
SWAPPED_TOKEN = ";"  # the engine's token that the `token_ids` defect's trainer reads as UNKNOWN_TOKEN
UNKNOWN_TOKEN = "<unk>"
MAX_SEQS = 12  # `batch_variant`: sequences per engine batch; the last B mod MAX_SEQS rows are a partial one
SPLITS = 2  # `batch_variant`: the chunks of the hidden size its split-K output layer sums
MERGED_OFFSET = 0.05  # std of the per-id logit offset `frozen_policy` adds at each weight sync
SEQUENCE_WEIGHT_CAP = 2.0  # `sequence_sum`: the weight is applied truncated at this (and recorded as computed)


def engine_sampling(defect: str, temperature: float) -> dict[str, Any]:
    """The `sampling` of run.json (TokenRecorder) as the engine reports its own settings: the
    temperature, top-p 0.8 for `top_p` (whose processed log-probs are renormalised), logprobs
    "raw" for `raw_logprobs`; no logit processor. The other defects are invisible in an engine's
    settings."""
    return {
        "temperature": temperature,
        "top_p": TOP_P if defect in TRUNCATING else None,
        "top_k": None,
        "min_p": None,
        "logprobs": "raw" if defect == "raw_logprobs" else "processed",
        "processors": [],
    }


def nucleus_logits(scaled: torch.Tensor, p: float) -> torch.Tensor:
    """`scaled` (..., V) with the ids outside the top-p nucleus set to −inf: the smallest set of
    most likely ids whose probability reaches p (the most likely id is always kept)."""
    probs, order = torch.softmax(scaled, -1).sort(-1, descending=True)
    before = probs.cumsum(-1) - probs  # (..., V) mass of the more likely ids
    dropped = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before >= p)
    return scaled.masked_fill(dropped, -torch.inf)


def engine_token(
    logits: torch.Tensor,  # (B, V) float32: the engine's logits at the position, noise added
    *,
    temperature: float,
    topk: int,
    defect: str,
    generator: torch.Generator | None,
    greedy: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One position of the engine: (token (B,), its reported log μ (B,), μ's top-K ids (B, K),
    their reported log μ (B, K)). Samples from softmax(logits / τ) (argmax when `greedy`),
    top-p filtered for the `top_p` defect; reports log-probs of softmax(logits / τ), of
    softmax(logits) for `raw_logprobs`, of the renormalised nucleus for `top_p`."""
    scaled = logits / temperature  # (B, V)
    sampled_from = nucleus_logits(scaled, TOP_P) if defect in TRUNCATING else scaled
    if greedy:
        tok = scaled.argmax(-1)
    else:
        tok = torch.multinomial(torch.softmax(sampled_from, -1), 1, generator=generator).squeeze(-1)
    reported = logits if defect == "raw_logprobs" else sampled_from
    logp = token_logp(reported, tok)  # (B,)
    ids_k, logp_k = topk_from_logits(reported, tok, topk, 1.0)
    return tok, logp, ids_k, logp_k


def split_k_hook(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    """Forward hook of the engine's output layer (a bias-free Linear) under `batch_variant`: the
    logits (B, L, V) with the rows of the partial engine batch (from B − B mod MAX_SEQS on)
    recomputed as Σ_c h_c · W_cᵀ over SPLITS chunks c of the hidden size."""
    first = len(output) - len(output) % MAX_SEQS
    if first == len(output):
        return output
    h, w = args[0][first:], module.weight  # (b, L, d), (V, d)
    assert isinstance(w, torch.Tensor)
    parts = [hc @ wc.T for hc, wc in zip(h.chunk(SPLITS, -1), w.chunk(SPLITS, -1), strict=True)]
    return torch.cat([output[:first], torch.stack(parts).sum(0).to(output.dtype)])


def sampling_support(logits: torch.Tensor, *, temperature: float, defect: str) -> torch.Tensor | None:
    """The engine's sampling mask at a position, (B, V) bool (True on the ids it could sample):
    the top-p nucleus of softmax(logits / τ), as `engine_token` samples from it, for `top_p_mask`;
    None for the other defects (no mask returned)."""
    if defect != "top_p_mask":
        return None
    return nucleus_logits(logits / temperature, TOP_P).isfinite()


def support_of(logits: torch.Tensor, support: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """`record`'s support_size and pi_support_mass (Σ π over the support, probability mass) from
    π's logits / τ (B, T, V) and the engine's sampling masks `support` (B, T, V) bool; {} without
    masks."""
    if support is None:
        return {}
    mass = (logits.float().softmax(-1) * support).sum(-1).clamp(max=1.0)  # (B, T)
    return {"support_size": support.sum(-1).float(), "pi_support_mass": mass}


def merged_offset(vocab: int) -> torch.Tensor:
    """The logit offset (V,) float32 that `frozen_policy` adds at every sync: N(0, MERGED_OFFSET²)
    per token id, the same in every run (an adapter's fixed delta)."""
    return torch.randn(vocab, generator=torch.Generator().manual_seed(0)) * MERGED_OFFSET


def resumed_after(steps: int) -> int:
    """The last step `resume` trains before its restart: steps // 2 − 1, the run's first half."""
    return steps // 2 - 1


def sequence_weight(
    mu_logp: torch.Tensor,  # (B, T) log μ(a_t)
    old_logp: torch.Tensor,  # (B, T) log π_old(a_t)
    response_mask: torch.Tensor,  # (B, T) bool
) -> torch.Tensor:
    """`sequence_sum`'s per-response weight (B,) float32: w = exp(Σ_t log(π_old/μ)) over the
    response tokens, the sum of the token log-ratios where the geometric mean exp((1/|y|) Σ_t …)
    belongs. Unitless; it scales with the response length (≈ exp(−|y|·KL))."""
    log_ratio = torch.where(response_mask, old_logp.double() - mu_logp.double(), 0.0)  # (B, T)
    return log_ratio.sum(-1).exp().float()


def weighted_advantages(advantages: torch.Tensor, seq_weight: torch.Tensor | None) -> torch.Tensor:
    """The advantages (B,) the loss sees: A_i · min(w_i, SEQUENCE_WEIGHT_CAP) under `sequence_sum`
    (the loss is linear in A, so this weights response i's token losses), `advantages` itself
    without a sequence weight."""
    return advantages if seq_weight is None else advantages * seq_weight.clamp(max=SEQUENCE_WEIGHT_CAP)


def deliver(batch: Rollout, defect: str, *, tokenizer, generator: torch.Generator) -> Rollout:
    """The rollout as the trainer receives it (see the module docstring): `batch` itself when
    the defect is not one of delivery (shifted, sentinel, token_ids), else a new Rollout."""
    mask = batch.response_mask  # (B, T)
    if defect == "shifted":
        before = torch.cat([batch.mu_logp[:, :1], batch.mu_logp[:, :-1]], 1)  # (B, T) log μ of t − 1
        return replace(batch, mu_logp=torch.where(mask, before, batch.mu_logp))
    if defect == "sentinel":
        hit = mask & (torch.rand(mask.shape, generator=generator) < SENTINEL_SHARE)
        return replace(batch, mu_logp=batch.mu_logp.masked_fill(hit, SENTINEL))
    if defect == "token_ids":
        swapped, unknown = tokenizer.convert_tokens_to_ids([SWAPPED_TOKEN, UNKNOWN_TOKEN])
        response_ids = batch.response_ids.masked_fill(mask & (batch.response_ids == swapped), unknown)
        input_ids = torch.cat([batch.input_ids[:, : batch.prompt_len], response_ids], 1)
        # μ's top-K ids go through the same vocabulary: the sampled id stays in its set. A set that
        # held <unk> as well keeps its ids distinct: that entry becomes `;` at μ = 0
        valid = mask[..., None]  # (B, T, 1)
        was_swapped, was_unknown = batch.mu_topk_ids == swapped, batch.mu_topk_ids == unknown  # (B, T, K)
        both = valid & was_unknown & was_swapped.any(-1, keepdim=True)
        topk_ids = batch.mu_topk_ids.masked_fill(valid & was_swapped, unknown).masked_fill(both, swapped)
        topk_logp = batch.mu_topk_logp.masked_fill(both, -math.inf)
        return replace(
            batch, response_ids=response_ids, input_ids=input_ids, mu_topk_ids=topk_ids, mu_topk_logp=topk_logp
        )
    return batch


__all__ = [
    "ENGINE_DEFECTS",
    "check_defect",
    "deliver",
    "engine_sampling",
    "engine_token",
    "merged_offset",
    "nucleus_logits",
    "resumed_after",
    "sampling_support",
    "sequence_weight",
    "split_k_hook",
    "support_of",
    "weighted_advantages",
]
