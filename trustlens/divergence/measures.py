"""Divergences between the rollout policy μ and the trained policy π, per token.

All inputs are log-probabilities or logits; every result is computed in float32 or wider (float64
when an input is float64) in log space, so that probabilities near 0 and near 1 keep their
precision. Units: TV is a probability mass in [0, 1]; KL is in nats, always KL(μ ‖ π).

Binary forms look at two buckets per position, {a_t, everything else}:
    binary_tv = |π(a_t) − μ(a_t)|
    binary_kl = μ log(μ/π) + (1−μ) log((1−μ)/(1−π))          = KL(μ_bin ‖ π_bin)

Top-K forms look at K + 1 buckets: S, μ's top-K token ids at the position (the sampled token
forced in, see `topk_from_logits`), one bucket each, plus rest = everything else:
    topk_tv = ½ (Σ_{i∈S} |μ_i − π_i| + |μ_rest − π_rest|)
    topk_kl = Σ_{i∈S} μ_i log(μ_i/π_i) + μ_rest log(μ_rest/π_rest)
Exact forms use every token of the vocabulary as its own bucket. Each bucketing coarsens the
next, so binary ≤ top-K ≤ exact for both TV and KL (data-processing inequality).

Logits may hold −inf (a masked token: probability 0); NaN, +inf and rows of only −inf raise.

Memory: the full-vocabulary functions never build a (N, V) log-softmax. They walk the rows in
chunks of about `CHUNK_ELEMENTS` elements (at least one row), so their extra memory is O(N·K)
plus one chunk whatever N is, and each chunk stays in cache while it is worked on.

Speed: on large inputs (≥ COMPILE_MIN_ELEMENTS logits) `topk_divergence` sends blocks of flat
rows (μ's rest mass ≥ ½) to a torch.compile'd one-pass exp-sum kernel; the first such call
compiles it (seconds; cached on disk by torch). Peaked rows, small inputs, and machines where
torch.compile fails (a warning says so) or TRUSTLENS_NO_COMPILE=1 use the eager chunk loop,
with the same results to float32 rounding.

The chunked passes, the compiled kernel and both constants live in `trustlens.divergence.vocab_chunks`;
this module turns bucket log-probabilities into divergences (`exact_divergence`,
`entropy_from_logits` and `topk_from_logits`, over every token: trustlens.divergence.full_vocab).
"""

from __future__ import annotations

import math

from trustlens.core import logspace
from trustlens.core.argument_checks import check_temperature
from trustlens.core.tensor_checks import (
    LOGP_TOLERANCE,
    check_logp,
    check_same_device,
    check_same_shape,
    check_token_ids,
)
from trustlens.core.torch_import import torch
from trustlens.divergence import kernels, vocab_chunks
from trustlens.divergence.arguments import check_lead, check_logits, lead_index, result_dtype


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − exp(x)) for x ≤ 0, exact at both ends (Mächler 2012): −inf at x = 0."""
    return logspace.log1mexp(x, torch)


def _abs_diff_exp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|exp(a) − exp(b)|, exact when a ≈ b, 0 when both are −inf (see logspace.abs_diff_exp)."""
    return logspace.abs_diff_exp(a, b, torch)


def binary_tv(pi_logp: torch.Tensor, mu_logp: torch.Tensor) -> torch.Tensor:
    """|π(a_t) − μ(a_t)| from log-probabilities of the sampled tokens; any shape, float32+.
    A log-probability of −inf (probability 0) is valid."""
    check_same_device(pi_logp=pi_logp, mu_logp=mu_logp)
    pi_logp, mu_logp = check_logp("pi_logp", pi_logp), check_logp("mu_logp", mu_logp)
    check_same_shape(pi_logp=pi_logp, mu_logp=mu_logp)
    return _abs_diff_exp(pi_logp, mu_logp)


def binary_kl(pi_logp: torch.Tensor, mu_logp: torch.Tensor) -> torch.Tensor:
    """KL(μ_bin ‖ π_bin) in nats over the buckets {a_t, rest}; any shape, float32+.

    μ log(μ/π) + (1−μ)(log(1−μ) − log(1−π)), with log(1−p) from `log1mexp`; a bucket with
    μ = 0 exactly contributes 0 (0 log 0 = 0) and the result is clamped at 0 against rounding.
    π(a_t) = 0 (pi_logp = −inf) with μ(a_t) > 0 gives +inf: a valid value, beyond every threshold.

    Log-prob 0, deliberately: a softmax over finite logits never gives π = 1, so pi_logp = 0
    exactly is a log_softmax that rounded (float32 does so once π > 1 − 6e-8). Such a π is read
    as 1 − π = ε/2 of the input's dtype (6e-8 for float32), the middle of what the rounding
    hides, instead of 1 − π = 0, which would make the KL +inf and block every confident token
    whose μ(a_t) < 1. The rules use the same reading (trustlens.rules).
    """
    in_dtype = pi_logp.dtype if isinstance(pi_logp, torch.Tensor) else torch.float32
    check_same_device(pi_logp=pi_logp, mu_logp=mu_logp)
    pi_logp, mu_logp = check_logp("pi_logp", pi_logp), check_logp("mu_logp", mu_logp)
    check_same_shape(pi_logp=pi_logp, mu_logp=mu_logp)
    return logspace.binary_kl(pi_logp, mu_logp, torch.finfo(in_dtype).eps, torch)


def bucket_divergence(log_mu: torch.Tensor, log_pi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(TV, KL(μ ‖ π)) over the last dim of bucket log-probabilities (N, B), in float64.

    A bucket with μ = 0 adds nothing to the KL; one with μ > 0 and π = 0 makes it +inf.
    """
    log_mu, log_pi = log_mu.double(), log_pi.double()
    kl_terms = torch.exp(log_mu) * (log_mu - log_pi)
    kl_terms = torch.where(log_mu == -math.inf, torch.zeros_like(kl_terms), kl_terms)
    tv = 0.5 * _abs_diff_exp(log_mu, log_pi).sum(-1)
    return tv.clamp(0.0, 1.0), kl_terms.sum(-1).clamp(min=0.0)


def topk_divergence(
    pi_logits: torch.Tensor,
    mu_topk_ids: torch.Tensor,
    mu_topk_logp: torch.Tensor,
    *,
    temperature: float = 1.0,
    sampled_ids: torch.Tensor | None = None,
    sampled_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_tv, topk_kl) per position, shaped like pi_logits' leading dims: `bucket_divergence`
    of the buckets of `topk_buckets` (same arguments)."""
    log_mu, log_pi = topk_buckets(
        pi_logits,
        mu_topk_ids,
        mu_topk_logp,
        temperature=temperature,
        sampled_ids=sampled_ids,
        sampled_logp=sampled_logp,
    )
    dtype = result_dtype(pi_logits, mu_topk_logp)
    tv, kl = bucket_divergence(log_mu, log_pi)
    return tv.to(dtype), kl.to(dtype)


def topk_buckets(
    pi_logits: torch.Tensor,
    mu_topk_ids: torch.Tensor,
    mu_topk_logp: torch.Tensor,
    *,
    temperature: float = 1.0,
    sampled_ids: torch.Tensor | None = None,
    sampled_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log μ, log π) on the K + 1 buckets of the top-K divergence, (..., K + 1) float64 each
    with pi_logits' leading dims: μ's top-K ids S first (a_t forced in, see below), the rest of
    the vocabulary last. `topk_mass` gives Σ_S of either.

    pi_logits: (..., V) π's logits, any float dtype; divided by `temperature` (the rollout's
    sampling temperature) before the softmax, without a copy.
    mu_topk_ids: (..., K) integer ids of μ's top-K set S (distinct).
    mu_topk_logp: (..., K) log μ on S, as the rollout engine recorded them.
    sampled_ids: (...) the sampled token a_t of each position. S must hold it (docs/rules.md), so
        that the buckets {a_t, rest} coarsen S ∪ {rest} and topk_tv ≥ binary_tv,
        topk_kl ≥ binary_kl. Where S lacks it, it is forced in: it replaces the id of S with the
        smallest log μ (the K-th of a set in descending order), with log μ(a_t) from
        `sampled_logp` (...); without sampled_logp that is a ValueError naming the position.
        None: S is taken as given (e.g. from `topk_from_logits`, which forces a_t in itself).
    The K + 1 buckets are S ∪ {rest}; log μ_rest = log1mexp(logsumexp(log μ_S)), in float64. A
    bucket with μ > 0 to which π gives probability 0 (a −inf logit) makes the KL +inf, a valid
    value.
    π's log-probs come from one exp-and-sum pass over the vocabulary, chunk by chunk, plus a
    gather (see `trustlens.divergence.vocab_chunks.logp_on_ids`): extra memory O(N·K) plus one chunk.
    """
    check_same_device(
        pi_logits=pi_logits,
        mu_topk_ids=mu_topk_ids,
        mu_topk_logp=mu_topk_logp,
        sampled_ids=sampled_ids,
        sampled_logp=sampled_logp,
    )
    temperature = check_temperature(temperature)
    pi_logits = check_logits("pi_logits", pi_logits)
    if not isinstance(mu_topk_ids, torch.Tensor):
        raise ValueError(f"mu_topk_ids must be a torch.Tensor, got {type(mu_topk_ids).__name__}")
    logp_dtype: torch.dtype = getattr(mu_topk_logp, "dtype", torch.float32)
    mu_topk_logp = check_logp("mu_topk_logp", mu_topk_logp)
    check_same_shape(mu_topk_ids=mu_topk_ids, mu_topk_logp=mu_topk_logp)
    check_lead("mu_topk_ids", mu_topk_ids, "pi_logits", pi_logits, extra=1)
    V, K = pi_logits.shape[-1], mu_topk_ids.shape[-1]
    if K == 0:
        raise ValueError("mu_topk_ids holds no ids (K = 0); a top-K set needs K ≥ 1")
    if K > V:
        raise ValueError(f"mu_topk_ids has K = {K} ids per position, more than the vocabulary of pi_logits (V = {V})")
    ids = check_token_ids("mu_topk_ids", mu_topk_ids, V, distinct=True).reshape(-1, K)
    dtype = result_dtype(pi_logits, mu_topk_logp)

    # μ's side is small (N, K): float64, so that a small μ_rest = 1 − Σ_S μ keeps the digits
    # its float32 log-probs carry.
    log_mu = mu_topk_logp.double().reshape(-1, K)
    if sampled_ids is not None:
        ids, log_mu = _force_sampled(pi_logits, ids, log_mu, sampled_ids, sampled_logp)
    log_mu_rest = _log_rest("mu_topk_logp", log_mu, logp_dtype, pi_logits.shape[:-1], whole=K == V)

    if (impl := kernels.pass_impl(pi_logits.device)) is not None:  # one pass on the accelerator
        done = kernels.run_pass(pi_logits, kernels.row_starts(pi_logits), ids, K, temperature, impl)
        kernels.raise_bad_row("pi_logits", pi_logits, done.bad)
        log_pi, log_pi_rest = done.logp_ids, done.log_rest
    else:
        log_pi, log_pi_rest = vocab_chunks.logp_on_ids("pi_logits", pi_logits, ids, temperature, dtype, log_mu_rest)
    lead = pi_logits.shape[:-1]
    return (
        torch.cat([log_mu, log_mu_rest[:, None]], -1).reshape(*lead, K + 1),
        torch.cat([log_pi, log_pi_rest[:, None]], -1).reshape(*lead, K + 1),
    )


def topk_mass(log_buckets: torch.Tensor) -> torch.Tensor:
    """Σ_{i∈S} p_i per position from bucket log-probabilities (..., K + 1) (`topk_buckets`: S
    first, the rest bucket last), in their dtype: the probability mass a distribution puts on μ's
    top-K set. A μ renormalised over a support inside S has mass 1 there where π has less."""
    return torch.logsumexp(log_buckets[..., :-1], -1).exp().clamp(max=1.0)


def _log_rest(name: str, log_topk: torch.Tensor, dtype: torch.dtype, lead: torch.Size, *, whole: bool) -> torch.Tensor:
    """log(1 − Σ_S p) per row of float64 log-probabilities on S (N, K), given in `dtype`;
    −inf when S is the whole vocabulary (`whole`). ValueError naming `name` and the index in
    `lead` when a set's mass exceeds 1 by more than the input's rounding."""
    mass = torch.logsumexp(log_topk, -1)  # (N,) log Σ_S p
    tolerance = max(LOGP_TOLERANCE, 4 * torch.finfo(dtype).eps)  # rounding of the input
    if bool((mass > tolerance).any()):
        row = int(torch.nonzero(mass > tolerance)[0, 0])
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(row), lead))
        raise ValueError(
            f"{name} at index {idx} gives a top-K mass of {math.exp(float(mass[row])):.6g} > 1; "
            "pass log-probabilities of one distribution"
        )
    return torch.full_like(mass, -math.inf) if whole else log1mexp(mass.clamp(max=0.0))


def topk_divergence_from_logp(
    pi_topk_logp: torch.Tensor, mu_topk_logp: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_tv, topk_kl) per position from log π and log μ on μ's top-K set S (..., K) each,
    for trainers that keep π only on S (TRL's DPPOTrainer): the buckets of `topk_divergence`,
    with π_rest = 1 − Σ_S π from the given log-probs instead of a pass over π's logits. S must
    hold the sampled token (as `topk_from_logits` and TRL's rollout record it). Float32 results
    (float64 when an input is); +inf KL where π gives 0 to an id of S that μ gave mass to.
    """
    pi_dtype, mu_dtype = (getattr(t, "dtype", torch.float32) for t in (pi_topk_logp, mu_topk_logp))
    check_same_device(pi_topk_logp=pi_topk_logp, mu_topk_logp=mu_topk_logp)
    pi_topk_logp = check_logp("pi_topk_logp", pi_topk_logp)
    mu_topk_logp = check_logp("mu_topk_logp", mu_topk_logp)
    check_same_shape(pi_topk_logp=pi_topk_logp, mu_topk_logp=mu_topk_logp)
    if mu_topk_logp.dim() == 0 or mu_topk_logp.shape[-1] == 0:
        raise ValueError(f"mu_topk_logp must have shape (..., K) with K ≥ 1, got {tuple(mu_topk_logp.shape)}")
    lead, K = mu_topk_logp.shape[:-1], mu_topk_logp.shape[-1]
    dtype = result_dtype(pi_topk_logp, mu_topk_logp)
    log_pi, log_mu = pi_topk_logp.double().reshape(-1, K), mu_topk_logp.double().reshape(-1, K)
    rest_pi = _log_rest("pi_topk_logp", log_pi, pi_dtype, lead, whole=False)
    rest_mu = _log_rest("mu_topk_logp", log_mu, mu_dtype, lead, whole=False)
    tv, kl = bucket_divergence(torch.cat([log_mu, rest_mu[:, None]], -1), torch.cat([log_pi, rest_pi[:, None]], -1))
    return tv.to(dtype).reshape(lead), kl.to(dtype).reshape(lead)


def _force_sampled(
    pi_logits: torch.Tensor,
    ids: torch.Tensor,  # (N, K) int64
    log_mu: torch.Tensor,  # (N, K) float64
    sampled_ids: object,  # (...) lead shape of pi_logits
    sampled_logp: object,  # (...) or None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, log_mu) with the sampled token in every set: where a row lacks it, it replaces the
    entry of smallest log μ, with its log μ from sampled_logp (see `topk_divergence`)."""
    sampled = check_token_ids("sampled_ids", sampled_ids, pi_logits.shape[-1])
    check_lead("sampled_ids", sampled, "pi_logits", pi_logits, extra=0)
    sampled = sampled.reshape(-1, 1).to(ids.device)
    missing = torch.nonzero(~(ids == sampled).any(-1))[:, 0]  # (M,) rows without a_t
    if not missing.numel():
        return ids, log_mu
    if sampled_logp is None:
        row = int(missing[0])
        raise ValueError(
            f"mu_topk_ids at index {lead_index(pi_logits, row)} lacks the sampled token "
            f"{int(sampled[row, 0])} ({missing.numel()} positions do); pass sampled_logp (log μ(a_t)) "
            "to force it into the set, or top-K sets that hold the sampled token"
        )
    logp = check_logp("sampled_logp", sampled_logp)
    check_lead("sampled_logp", logp, "pi_logits", pi_logits, extra=0)
    return force_sampled(ids, log_mu, sampled[:, 0], logp.double().reshape(-1).to(log_mu.device))


def force_sampled(
    ids: torch.Tensor,  # (N, K) int64 μ's top-K ids
    log_mu: torch.Tensor,  # (N, K) their log μ
    sampled: torch.Tensor,  # (N,) int64 the sampled token a_t
    sampled_logp: torch.Tensor,  # (N,) log μ(a_t)
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, log_mu) with a_t in every set: in a row that lacks it, a_t and log μ(a_t) replace
    the entry of smallest log μ. New tensors; no host synchronisation."""
    missing = ~(ids == sampled[:, None]).any(-1)  # (N,)
    slot = torch.arange(ids.shape[-1], device=ids.device) == log_mu.argmin(-1, keepdim=True)  # (N, K)
    hit = missing[:, None] & slot
    return torch.where(hit, sampled[:, None], ids), torch.where(hit, sampled_logp[:, None].to(log_mu.dtype), log_mu)
