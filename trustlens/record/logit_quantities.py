"""What a `TokenRecorder.record` call derives from π's logits, at the valid positions only:

- entropy: H(π) = −Σ_v π_v log π_v of π = softmax(logits / τ), nats (`entropy_from_logits`);
- topk_tv, topk_kl: TV(μ, π) and KL(μ ‖ π) over μ's top-K ids plus one bucket for the rest of the
  vocabulary, KL in nats (`topk_divergence`, docs/rules.md). The sampled token a_t is always in
  the set: where μ's set lacks it, a_t replaces the id of smallest log μ with log μ(a_t) from
  `mu_logp` (without `mu_logp` such a set is a ValueError naming its (b, t)), so that
  topk_tv ≥ binary_tv and topk_kl ≥ binary_kl on every row;
- mu_topk_mass, pi_topk_mass: Σ_{i∈S} μ_i and Σ_{i∈S} π_i over that set S (`topk_mass`), with
  the top-K: a μ renormalised over a truncated support inside S has mass 1 there, π less;
- pi_logp_raw: log softmax(logits)(a_t), π before the sampling temperature (τ·(logits/τ)), when
  τ ≠ 1: what an engine that returns raw log-probs reports as μ. On the CPU it costs one more
  exp-and-sum pass per chunk (`python benchmarks/divergence.py --only record`: 1.21× the call at
  τ = 1 on 1024 × 151,936 float32 logits, one thread of the 2-core CPU machine); on CUDA it is a
  second running sum in the same read.

On the CPU the valid rows are gathered a chunk of about LOGIT_CHUNK_ELEMENTS (rows × vocabulary)
at a time, so that no (N, V) copy of them is made. On CUDA one logit pass
(trustlens.divergence.kernels) reads every valid row in place once for all the quantities; the
checks of the inputs are device-side flags, read back by `record` with its other checks in its
one host synchronisation (`pending_logit_quantities`), and only when one is set does the chunked
path run again to name the argument and the (b, t) of the bad value.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from trustlens.core.tensor_checks import LOGP_TOLERANCE
from trustlens.divergence import (
    bucket_divergence,
    entropy_from_logits,
    force_sampled,
    kernels,
    log1mexp,
    topk_buckets,
    topk_mass,
    vocab_chunks,
)
from trustlens.record.args import check_tensor_shape, id_tensor
from trustlens.record.token_rows import check_token_range

# logits are processed in gathered chunks of about this many elements (rows × vocabulary)
LOGIT_CHUNK_ELEMENTS = 1 << 24


def logit_quantities(
    logits: object,  # (B, T, V) π's logits, divided by `temperature` here
    mask: torch.Tensor,  # (B, T) bool: True at the valid positions
    ids: torch.Tensor,  # (B, T) int: the sampled ids
    topk_ids: object,  # (B, T, K) μ's top-K ids; None: no top-K
    topk_logp: object,  # (B, T, K) their log μ; None with topk_ids
    mu_logp: torch.Tensor | None,  # (B, T) log μ(a_t), forced into sets that lack a_t; None: none
    temperature: float,  # the rollout's sampling temperature τ
    *,
    want_entropy: bool,
) -> dict[str, torch.Tensor]:  # name -> (B, T)
    """{"entropy": …, "topk_tv": …, "topk_kl": …, "mu_topk_mass": …, "pi_topk_mass": …,
    "pi_logp_raw": …} (B, T), 0 in the padding: the entropy (when `want_entropy`), the top-K
    TV/KL and masses (when μ's top-K is given) and log π(a_t) of the raw logits (when
    `temperature` ≠ 1) at the valid positions, in float32 (float64 when the logits are). `ids`
    are checked here against the vocabulary at the valid positions; a bad argument is a
    ValueError naming it (and the (b, t) of a bad value)."""
    pending = pending_logit_quantities(
        logits, mask, ids, topk_ids, topk_logp, mu_logp, temperature, want_entropy=want_entropy
    )
    if pending.bad is not None and bool(pending.bad):  # one host synchronisation
        pending.explain()
    return pending.columns


@dataclasses.dataclass
class PendingQuantities:
    """`logit_quantities` before its value checks are read back: `columns` are valid only while
    `bad` is False."""

    columns: dict[str, torch.Tensor]  # name -> (B, T)
    bad: torch.Tensor | None  # () bool on the logits' device: an input check failed; None: checked already
    given: LogitInputs  # the arguments, for `explain`

    def explain(self) -> None:
        """Run the checked path, which raises the ValueError naming the bad value (when `bad`)."""
        if self.bad is not None:
            _chunked(self.given)


def pending_logit_quantities(
    logits: object,
    mask: torch.Tensor,
    ids: torch.Tensor,
    topk_ids: object,
    topk_logp: object,
    mu_logp: torch.Tensor | None,
    temperature: float,
    *,
    want_entropy: bool,
) -> PendingQuantities:
    """`logit_quantities` (same arguments) without reading anything back on an accelerator: its
    checks there become the device flag `bad`, for the caller to read with its own (`record`'s
    one host synchronisation). On the CPU the quantities come checked (`bad` None)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(mask.shape):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a (B, T, V) tensor with (B, T) = {tuple(mask.shape)}, got {got}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got dtype {logits.dtype}")
    topk: tuple[torch.Tensor, torch.Tensor] | None = None  # (B·T, K) μ's top-K ids and log μ, every position
    if topk_ids is not None:
        k = topk_ids.shape[-1] if isinstance(topk_ids, torch.Tensor) and topk_ids.dim() == 3 else -1
        checked_ids = id_tensor("mu_topk_ids", topk_ids, (*mask.shape, k))
        check_tensor_shape("mu_topk_logp", topk_logp, (*mask.shape, k))
        assert isinstance(topk_logp, torch.Tensor), "checked by check_tensor_shape"
        topk = checked_ids.to(mask.device).reshape(-1, k), topk_logp.to(mask.device).reshape(-1, k)
    given = LogitInputs(logits, mask, ids, topk, mu_logp, temperature, want_entropy)
    impl = kernels.pass_impl(logits.device)
    if impl is None:
        return PendingQuantities(_chunked(given), None, given)
    columns, bad = _one_pass(given, impl)
    return PendingQuantities(columns, bad, given)


@dataclasses.dataclass
class LogitInputs:
    """The arguments of `logit_quantities`, the top-K's shapes checked."""

    logits: torch.Tensor  # (B, T, V)
    mask: torch.Tensor  # (B, T) bool
    ids: torch.Tensor  # (B, T) the sampled ids
    topk: tuple[torch.Tensor, torch.Tensor] | None  # (B·T, K) μ's top-K ids and log μ, every position
    mu_logp: torch.Tensor | None  # (B, T) log μ(a_t)
    temperature: float  # τ
    want_entropy: bool  # whether the entropy is wanted

    def parts(self) -> tuple:
        """The fields in order, not copied (dataclasses.astuple would deep-copy the tensors)."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))


def _sampled_in_sets(
    topk: tuple[torch.Tensor, torch.Tensor],  # (N, K) ids and log μ of the sets
    sampled: torch.Tensor,  # (N,) the sampled ids
    mu_logp: torch.Tensor | None,  # (N,) log μ(a_t); None: not given
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, log μ, lacking (N,) bool): the sets with a_t forced in from `mu_logp`; without
    `mu_logp` the sets as given, and `lacking` marks those without a_t (record raises for them)."""
    ids, log_mu = topk[0].long(), topk[1].double()
    if mu_logp is None:
        return ids, log_mu, ~(ids == sampled[:, None]).any(-1)
    ids, log_mu = force_sampled(ids, log_mu, sampled, mu_logp.double())
    return ids, log_mu, torch.zeros_like(sampled, dtype=torch.bool)


def _raise_lacking(lacking: torch.Tensor, index: torch.Tensor, sampled: torch.Tensor, width: int) -> None:
    """ValueError for the first set (flat row `index`) without its sampled token, if any."""
    found = torch.nonzero(lacking)[:1, 0]
    if found.numel():
        row = int(found[0])
        raise ValueError(
            f"mu_topk_ids at (b, t) = {divmod(int(index[row]), width)} lacks the sampled token "
            f"{int(sampled[row])} ({int(lacking.sum())} positions do); pass mu_logp so that record "
            "forces it into the set (topk_tv ≥ binary_tv needs it there), or top-K sets that hold it"
        )


def _chunked(given: LogitInputs) -> dict[str, torch.Tensor]:
    """The quantities from gathered chunks of valid rows, every input checked on the way."""
    logits, mask, ids, topk, mu_logp, temperature, want_entropy = given.parts()
    vocab = logits.shape[-1]
    check_token_range(ids, mask, vocab, " (the vocabulary of logits)")
    index = torch.nonzero(mask.reshape(-1))[:, 0]  # (N,) the valid positions, flat
    if topk is not None:
        sampled = ids.to(mask.device).reshape(-1).long().index_select(0, index)
        given_mu = None if mu_logp is None else mu_logp.to(mask.device).reshape(-1).index_select(0, index)
        k_ids, k_logp, lacking = _sampled_in_sets(
            (topk[0].index_select(0, index), topk[1].index_select(0, index)), sampled, given_mu
        )
        _raise_lacking(lacking, index, sampled, mask.shape[1])
        topk = k_ids, k_logp.to(topk[1].dtype)
    raw = temperature != 1.0
    wanted = _wanted(want_entropy, topk is not None, raw)
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    out = {name: torch.zeros(mask.numel(), dtype=dtype, device=mask.device) for name in wanted}  # (B·T,)
    flat = logits.reshape(-1, vocab)
    flat_ids = ids.to(mask.device).reshape(-1).long()
    rows = max(1, LOGIT_CHUNK_ELEMENTS // vocab)
    for start in range(0, len(index), rows):
        chunk_index = index[start : start + rows]
        chunk = flat.index_select(0, chunk_index)  # (n, V)
        where = f"at the valid positions from (b, t) = {divmod(int(chunk_index[0]), mask.shape[1])} on"
        if want_entropy or raw:
            bad = torch.isnan(chunk) | (chunk == math.inf)
            if bool(bad.any()):
                row = int(chunk_index[torch.nonzero(bad.any(-1))[0, 0]])
                raise ValueError(f"logits hold NaN or +inf at (b, t) = {divmod(row, mask.shape[1])}")
        if want_entropy:
            out["entropy"][chunk_index] = entropy_from_logits(chunk, temperature=temperature).to(dtype)
        if raw:  # one exp-and-sum pass of the chunk at τ = 1 (a row of only −inf raises, named)
            a_t = flat_ids.index_select(0, chunk_index)[:, None]  # (n, 1)
            try:
                raw_logp = vocab_chunks.logp_on_ids("logits", chunk, a_t, 1.0, dtype)[0][:, 0]
            except ValueError as err:
                raise ValueError(f"{err} ({where}; index counted over them)") from err
            out["pi_logp_raw"][chunk_index] = raw_logp.to(dtype)
        if topk is not None:
            sl = slice(start, start + rows)
            try:
                log_mu, log_pi = topk_buckets(chunk, topk[0][sl], topk[1][sl], temperature=temperature)
            except ValueError as err:
                raise ValueError(f"{err} ({where}; index counted over them)") from err
            for name, value in _topk_columns(log_mu, log_pi).items():
                out[name][chunk_index] = value.to(dtype)
    return {name: t.reshape(mask.shape) for name, t in out.items()}


def _wanted(entropy: bool, topk: bool, raw: bool) -> list[str]:
    """The columns a call computes: the entropy, the top-K's, the raw log-prob."""
    top = ["topk_tv", "topk_kl", "mu_topk_mass", "pi_topk_mass"] if topk else []
    return (["entropy"] if entropy else []) + top + (["pi_logp_raw"] if raw else [])


def _topk_columns(log_mu: torch.Tensor, log_pi: torch.Tensor) -> dict[str, torch.Tensor]:
    """topk_tv, topk_kl, mu_topk_mass, pi_topk_mass (N,) float64 from the buckets (N, K + 1)."""
    tv, kl = bucket_divergence(log_mu, log_pi)
    return {"topk_tv": tv, "topk_kl": kl, "mu_topk_mass": topk_mass(log_mu), "pi_topk_mass": topk_mass(log_pi)}


def _one_pass(given: LogitInputs, impl: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(the quantities, bad) from one logit pass over the valid rows in place, with no Python
    loop over rows and no host synchronisation; `bad` () bool: an input check failed (the caller
    then runs `_chunked`, which names the bad value). The checks, as device-side flags: sampled
    ids in the vocabulary, top-K ids in it and distinct, log μ on them ≤ 0 and of total mass ≤ 1,
    a_t in every set without `mu_logp`, and finite logits rows (from the pass's own running
    values)."""
    logits, mask, ids, topk, mu_logp, temperature, want_entropy = given.parts()
    vocab, device = logits.shape[-1], logits.device
    valid = mask.to(device).reshape(-1)  # (B·T,)
    sampled = ids.to(device).reshape(-1).long()
    flags = [valid & ((sampled < 0) | (sampled >= vocab))]  # (B·T,) each: a failed check at a valid row
    sampled = sampled.clamp(0, vocab - 1)  # the pass never reads outside a row
    set_ids, k = None, 0
    if topk is not None:
        k = topk[0].shape[-1]
        given_mu = None if mu_logp is None else mu_logp.to(device).reshape(-1)
        set_ids, log_mu, lacking = _sampled_in_sets((topk[0].to(device), topk[1].to(device)), sampled, given_mu)
        ordered = set_ids.sort(-1).values
        mass = torch.logsumexp(log_mu, -1)  # (B·T,) log Σ_S μ
        tolerance = max(LOGP_TOLERANCE, 4 * torch.finfo(topk[1].dtype).eps)
        bad_sets = ((set_ids < 0) | (set_ids >= vocab)).any(-1) | (ordered[:, 1:] == ordered[:, :-1]).any(-1)
        bad_sets |= (log_mu.isnan() | (log_mu > tolerance)).any(-1) | (mass > tolerance) | lacking
        flags.append(valid & bad_sets)
        set_ids = set_ids.clamp(0, vocab - 1)
        log_mu_rest = torch.full_like(mass, -math.inf) if k == vocab else log1mexp(mass.clamp(max=0.0))
    raw = temperature != 1.0
    if raw:  # a_t gathered after the set (not excluded from the sums): its raw log-prob
        set_ids = sampled[:, None] if set_ids is None else torch.cat([set_ids, sampled[:, None]], -1)
    done = kernels.run_pass(logits, kernels.row_starts(logits, valid), set_ids, k, temperature, impl, raw=raw)
    flags.append(done.bad)
    bad = torch.cat(flags).any()
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    out: dict[str, torch.Tensor] = {}
    zero = torch.zeros((), dtype=torch.float64, device=device)
    if want_entropy:
        out["entropy"] = done.entropy
    if topk is not None:
        out |= _topk_columns(
            torch.cat([log_mu.clamp(max=0.0), log_mu_rest[:, None]], -1),
            torch.cat([done.logp_ids[:, :k], done.log_rest[:, None]], -1),
        )
    if done.raw_logp_ids is not None:
        out["pi_logp_raw"] = done.raw_logp_ids[:, -1]
    return {name: torch.where(valid, t, zero).to(dtype).reshape(mask.shape) for name, t in out.items()}, bad
