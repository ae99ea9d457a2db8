"""Quantities of every token of the vocabulary, from logits: the exact TV and KL between two
policies' logits, the entropy, and μ's top-K (the formulas and units: trustlens.divergence.measures).
CPU tensors take the chunked passes (trustlens.divergence.vocab_chunks, never a (N, V)
log-softmax), CUDA tensors the one-pass kernels (trustlens.divergence.kernels).
"""

from __future__ import annotations

import math

from trustlens.core.argument_checks import check_temperature
from trustlens.core.tensor_checks import (
    check_same_device,
    check_same_shape,
    check_token_ids,
)
from trustlens.core.torch_import import torch
from trustlens.divergence import kernels, vocab_chunks
from trustlens.divergence.arguments import check_lead, check_logits, result_dtype

# `entropy_from_logits` works on three chunk-sized tensors at once (input, log-softmax, exp):
# chunks a quarter as large keep them together in cache (fastest of 2^14…2^18 when measured).
ENTROPY_CHUNK_ELEMENTS = vocab_chunks.CHUNK_ELEMENTS // 4


def exact_divergence(
    pi_logits: torch.Tensor, mu_logits: torch.Tensor, *, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(TV, KL(μ ‖ π)) over the whole vocabulary per position, from logits (..., V) of each,
    both divided by the sampling `temperature`.

    TV = ½ Σ_v |μ_v − π_v|, KL = Σ_v μ_v (log μ_v − log π_v), any float dtype in, float32 out
    (float64 when an input is). Rows are processed in chunks: extra memory is a few chunks, not
    (N, V) copies. A token with μ_v = 0 (a −inf logit) adds 0 to the KL; one with μ_v > 0 = π_v
    makes it +inf. On CUDA one exact pass reads both rows in place (twice: the TV and KL need both
    normalisers first), accumulating in float32 whatever the dtype
    (trustlens.divergence.kernels.exact_pass states the math).
    """
    check_same_device(pi_logits=pi_logits, mu_logits=mu_logits)
    temperature = check_temperature(temperature)
    pi_logits = check_logits("pi_logits", pi_logits)
    mu_logits = check_logits("mu_logits", mu_logits)
    check_same_shape(pi_logits=pi_logits, mu_logits=mu_logits)
    dtype = result_dtype(pi_logits, mu_logits)
    lead = pi_logits.shape[:-1]
    if (impl := kernels.pass_impl(pi_logits.device)) is not None:  # one exact pass on the accelerator
        done = kernels.run_exact(pi_logits, mu_logits, temperature, impl)
        _raise_bad_exact(pi_logits, mu_logits, torch.nonzero(done.bad)[:1, 0])
        return done.tv.to(dtype).reshape(lead), done.kl.to(dtype).reshape(lead)
    n = math.prod(pi_logits.shape[:-1])
    tv, kl = (torch.empty(n, dtype=dtype, device=pi_logits.device) for _ in range(2))
    rows = min(n, vocab_chunks.rows_per_chunk(pi_logits.shape[-1]))
    log_mu, log_pi, work = (
        torch.empty(rows, pi_logits.shape[-1], dtype=dtype, device=pi_logits.device) for _ in range(3)
    )
    for first, (pi, mu) in vocab_chunks.row_chunks(pi_logits, mu_logits):
        sl, r = slice(first, first + pi.shape[0]), pi.shape[0]
        for logits, out in ((mu, log_mu[:r]), (pi, log_pi[:r])):
            if logits.dtype != dtype:
                logits = work[:r].copy_(logits)  # upcast once, in cache
            if temperature != 1.0:  # shifted by the row max first, as the exact pass: an offset costs no digits
                logits = torch.sub(logits, logits.amax(-1, keepdim=True), out=work[:r])
                logits = torch.mul(logits, 1.0 / temperature, out=work[:r])  # as the kernels scale
            torch.log_softmax(logits, -1, out=out)
        ratio = torch.sub(log_mu[:r], log_pi[:r], out=work[:r])
        ratio.nan_to_num_(nan=0.0, posinf=math.inf, neginf=0.0)  # μ = 0 terms: 0·(−inf) = 0
        mu_p, pi_p = log_mu[:r].exp_(), log_pi[:r].exp_()
        torch.matmul(mu_p.unsqueeze(-2), ratio.unsqueeze(-1), out=kl[sl].view(-1, 1, 1))
        torch.sum(mu_p.sub_(pi_p).abs_(), -1, out=tv[sl])
    # NaN, +inf or a row of only −inf makes its log-softmax NaN, hence its TV: find the culprit.
    _raise_bad_exact(pi_logits, mu_logits, torch.nonzero(tv.isnan())[:1, 0])
    return tv.mul_(0.5).clamp_(0.0, 1.0).reshape(lead), kl.clamp_(min=0.0).reshape(lead)


def _raise_bad_exact(pi_logits: torch.Tensor, mu_logits: torch.Tensor, bad: torch.Tensor) -> None:
    """ValueError naming the argument and the index of the first NaN, +inf or row of only −inf
    in flat row `bad` (1,) of either logits; nothing when `bad` is empty."""
    if bad.numel():
        for name, logits in (("pi_logits", pi_logits), ("mu_logits", mu_logits)):
            vocab_chunks.check_row_maxima(name, logits, vocab_chunks.flat_rows(logits, bad).amax(-1), bad)


def entropy_from_logits(logits: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """Entropy H(π) = −Σ_v π_v log π_v of π = softmax(logits / temperature) per position, nats.

    logits (..., V), any float dtype; returns (...) in float32 (float64 when logits are). A −inf
    logit (probability 0) adds 0. Rows are processed in chunks with two scratch chunks reused
    throughout: no (N, V) log-softmax is built, and each chunk is worked on while in cache (on
    (768, 1010) float32 logits, 1.2 ms against 3.0 ms for one whole-tensor log-softmax). NaN, +inf
    and rows of only −inf raise.
    """
    temperature = check_temperature(temperature)
    logits = check_logits("logits", logits)
    dtype = result_dtype(logits)
    if (impl := kernels.pass_impl(logits.device)) is not None:  # one pass on the accelerator
        done = kernels.run_pass(logits, kernels.row_starts(logits), None, 0, temperature, impl)
        kernels.raise_bad_row("logits", logits, done.bad)
        return done.entropy.to(dtype).reshape(logits.shape[:-1])
    n = math.prod(logits.shape[:-1])
    out = torch.empty(n, dtype=dtype, device=logits.device)
    rows = min(n, max(1, ENTROPY_CHUNK_ELEMENTS // logits.shape[-1]))
    logp, work = (torch.empty(rows, logits.shape[-1], dtype=dtype, device=logits.device) for _ in range(2))
    for first, (chunk,) in vocab_chunks.row_chunks(logits, rows=rows):
        r = chunk.shape[0]
        if chunk.dtype != dtype:
            chunk = work[:r].copy_(chunk)  # upcast once, in cache
        if temperature != 1.0:
            chunk = torch.mul(chunk, 1.0 / temperature, out=work[:r])  # as the kernels scale
        torch.log_softmax(chunk, -1, out=logp[:r])
        p = torch.exp(logp[:r], out=work[:r])
        logp[:r].clamp_(min=torch.finfo(dtype).min)  # π_v = 0 terms: 0 · (−inf) → 0 · finite = 0
        torch.linalg.vecdot(p, logp[:r], out=out[first : first + r])
    bad = torch.nonzero(out.isnan())[:1, 0]  # NaN/+inf or a row of only −inf: find the culprit
    if bad.numel():
        vocab_chunks.check_row_maxima("logits", logits, vocab_chunks.flat_rows(logits, bad).amax(-1), bad)
    return out.neg_().clamp_(min=0.0).reshape(logits.shape[:-1])


def topk_from_logits(
    logits: torch.Tensor, sampled_ids: torch.Tensor, k: int, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """μ's top-K ids (..., k) int64 and their log-probs (..., k) at `temperature`, as a rollout
    engine records them: the k most probable tokens in descending order, except that a sampled
    token outside them replaces the k-th. logits: (..., V); sampled_ids: (...) integer.
    Float32 log-probs (float64 for float64 logits); memory as `topk_divergence`.
    """
    temperature = check_temperature(temperature)
    logits = check_logits("logits", logits)
    V = logits.shape[-1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= V:
        raise ValueError(f"k must be an int in [1, V = {V}] (the vocabulary of logits), got {k!r}")
    sampled = check_token_ids("sampled_ids", sampled_ids, V)
    check_lead("sampled_ids", sampled, "logits", logits, extra=0)
    sampled = sampled.reshape(-1, 1)
    ids = logits.topk(k, dim=-1).indices.reshape(-1, k)  # (N, k), descending
    missing = ~(ids == sampled).any(-1)
    ids[missing, -1] = sampled[missing, 0]
    dtype = result_dtype(logits)
    if (impl := kernels.pass_impl(logits.device)) is not None:  # one pass on the accelerator
        done = kernels.run_pass(logits, kernels.row_starts(logits), ids, 0, temperature, impl)
        kernels.raise_bad_row("logits", logits, done.bad)
        logp = done.logp_ids.to(dtype)
    else:
        logp = vocab_chunks.logp_on_ids("logits", logits, ids, temperature, dtype)[0].to(dtype)
    lead = logits.shape[:-1]
    return ids.reshape(*lead, k), logp.reshape(*lead, k)


def token_logp(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[ids] in nats, without materialising the log-softmax: logits (..., V),
    ids (...) -> (...). No argument checks: for tensors the caller made (the built-in trainer
    and engine), not users' input."""
    return logits.gather(-1, ids[..., None]).squeeze(-1) - logits.logsumexp(-1)
