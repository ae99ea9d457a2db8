"""One pass over π's logits for accelerator tensors: per valid row, the entropy of
softmax(logits / τ), log π on a few ids per row (μ's top-K set, the sampled token) and log π of
the rest of the vocabulary, and on request log softmax(logits) on the ids (the distribution before
the sampling temperature), from a single read of the row.

- `logit_pass`: a Triton kernel (trustlens.divergence.kernels.logit_pass), registered as the torch
  custom op `trustlens::logit_pass` so that a torch.compile'd trainer calling it keeps one graph.
- `logit_pass_reference`: the same quantities in torch, the fallback on CUDA without Triton or
  with TRUSTLENS_KERNELS=torch (compiled with dynamic shapes).

And the exact pass, exact TV(μ, π) and KL(μ ‖ π) over the whole vocabulary from both rows of
logits (it reads them twice: the TV needs both normalisers first):

- `exact_pass`: a Triton kernel (trustlens.divergence.kernels.exact_pass), the torch custom op
  `trustlens::exact_pass`;
- `exact_pass_reference`: the same in torch, the fallback.

`pass_impl(device)` says which one runs for tensors on `device`: "triton" or "torch" on CUDA,
None on the CPU, where trustlens.divergence keeps its chunked passes (the test oracle).
`run_pass` runs the logit pass and `finish` turns its five tensors into log-probabilities and
entropies; `run_exact` runs the exact pass and `finish_exact` turns its parts into TV and KL.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

from trustlens.core.tensor_checks import check_logit_rows
from trustlens.core.torch_import import torch
from trustlens.divergence.kernels.exact_pass_reference import exact_pass_torch
from trustlens.divergence.kernels.logit_pass_reference import logit_pass_torch
from trustlens.divergence.vocab_chunks import flat_rows

# TRUSTLENS_KERNELS=torch: the torch fallback instead of the Triton kernel on CUDA.
KERNELS_ENV = "TRUSTLENS_KERNELS"


@functools.cache
def triton_available() -> bool:
    """Whether Triton imports here (asked once: `pass_impl` runs on every call on CUDA)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def pass_impl(device: torch.device) -> str | None:
    """ "triton", "torch" or None (the CPU's chunked passes) for logits on `device`."""
    if device.type != "cuda":
        return None
    if os.environ.get(KERNELS_ENV, "").strip().lower() == "torch" or not triton_available():
        return "torch"
    return "triton"


@torch.library.custom_op("trustlens::logit_pass", mutates_args=())
def logit_pass_op(
    logits: torch.Tensor, row_start: torch.Tensor, ids: torch.Tensor, n_excluded: int, temperature: float, raw: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton logit pass as a torch op: (M, sum_rest, usum_rest, x_ids, sum_raw), see logit_pass."""
    from trustlens.divergence.kernels.logit_pass import logit_pass_triton

    return logit_pass_triton(logits, row_start, ids, n_excluded, temperature, raw)


@logit_pass_op.register_fake
def _logit_pass_fake(
    logits: torch.Tensor, row_start: torch.Tensor, ids: torch.Tensor, n_excluded: int, temperature: float, raw: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    n = row_start.shape[0]
    new = [logits.new_empty(n, dtype=torch.float32) for _ in range(4)]
    return new[0], new[1], new[2], logits.new_empty((n, ids.shape[1]), dtype=torch.float32), new[3]


@torch.library.custom_op("trustlens::exact_pass", mutates_args=())
def exact_pass_op(
    pi_logits: torch.Tensor, mu_logits: torch.Tensor, pi_start: torch.Tensor, mu_start: torch.Tensor, temperature: float
) -> torch.Tensor:
    """The Triton exact pass as a torch op: (6, N) float32 parts, see exact_pass."""
    from trustlens.divergence.kernels.exact_pass import exact_pass_triton

    return exact_pass_triton(pi_logits, mu_logits, pi_start, mu_start, temperature)


@exact_pass_op.register_fake
def _exact_pass_fake(
    pi_logits: torch.Tensor, mu_logits: torch.Tensor, pi_start: torch.Tensor, mu_start: torch.Tensor, temperature: float
) -> torch.Tensor:
    return pi_logits.new_empty((6, pi_start.shape[0]), dtype=torch.float32)


def row_starts(
    logits: torch.Tensor, valid: torch.Tensor | None = None, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """(N,) int64 element offset of each row of logits (..., V) from its first element, the
    leading dims' strides honoured: of every row (N = rows of logits) masked by `valid` (same
    leading shape, bool; −1 where False), or of the flat row indices `rows` (N,)."""
    lead = logits.shape[:-1]
    flat = torch.arange(math.prod(lead), device=logits.device) if rows is None else rows.long()
    offset = torch.zeros_like(flat)
    rest = flat
    for size, stride in zip(reversed(lead), reversed(logits.stride()[:-1]), strict=True):
        offset += (rest % size) * stride
        rest = rest // size
    if valid is not None:
        offset = torch.where(valid.reshape(-1), offset, -1)
    return offset


@dataclass
class LogitPass:
    """What one pass gives per row, in float64; rows not passed hold 0 (and `bad` False)."""

    entropy: torch.Tensor  # (N,) H(π) in nats, π = softmax(logits / τ)
    logp_ids: torch.Tensor  # (N, K_all) log π on the ids
    log_rest: torch.Tensor  # (N,) log π of every token outside the excluded ids
    bad: torch.Tensor  # (N,) bool: the row holds NaN or +inf, or only −inf
    raw_logp_ids: torch.Tensor | None = None  # (N, K_all) log softmax(logits) on the ids (τ = 1); None: not asked


def run_pass(
    logits: torch.Tensor,  # (..., V)
    row_start: torch.Tensor,  # (N,) from `row_starts`
    ids: torch.Tensor | None,  # (N, K_all) int64 ids in [0, V); None: none
    n_excluded: int,  # the first n_excluded ids of a row (a set of distinct ids) form its top-K bucket set
    temperature: float,
    impl: str,  # "triton" or "torch"
    *,
    raw: bool = False,  # also log softmax(logits) on the ids (`LogitPass.raw_logp_ids`)
) -> LogitPass:
    """The logit pass of `impl` over the rows at `row_start`, finished (`finish`)."""
    if ids is None:
        ids = torch.zeros(row_start.shape[0], 0, dtype=torch.int64, device=logits.device)
    ids = ids.long().contiguous()
    row_start = row_start.contiguous()
    if impl == "triton":
        parts = logit_pass_op(logits, row_start, ids, n_excluded, float(temperature), raw)
    else:
        parts = logit_pass_torch(logits, row_start, ids, n_excluded, float(temperature), raw)
    top, sum_rest, usum_rest, x_ids, sum_raw = parts
    done = finish(top, sum_rest, usum_rest, x_ids, n_excluded, row_start >= 0)
    if raw:
        done.raw_logp_ids = finish_raw(top, x_ids, sum_raw, float(temperature), done.bad | (row_start < 0))
    return done


def finish(
    top: torch.Tensor,  # (N,) M
    sum_rest: torch.Tensor,  # (N,) Σ_{v∉E} e^(x_v − M)
    usum_rest: torch.Tensor,  # (N,) Σ_{v∉E} (x_v − M) e^(x_v − M)
    x_ids: torch.Tensor,  # (N, K_all) x on the ids, E = the first n_excluded
    n_excluded: int,
    valid: torch.Tensor,  # (N,) bool: the rows passed
) -> LogitPass:
    """The pass's sums completed with the excluded ids, in float64 on (N, K) tensors:
    s = sum_rest + Σ_E e^z, u = usum_rest + Σ_E z e^z with z = x − M; then
    log π_ids = z − log s, log π_rest = log sum_rest − log s, H = log s − u / s.
    A row is bad when M or s is not finite (NaN/+inf logits, or a row of only −inf)."""
    top64 = top.double()
    z = x_ids.double() - top64[:, None]  # (N, K_all)
    ze = z[:, :n_excluded]
    e = torch.exp(ze)
    s = sum_rest.double() + e.sum(-1)
    u = usum_rest.double() + torch.where(e > 0, ze * e, 0.0).sum(-1)
    bad = valid & ~(torch.isfinite(top64) & torch.isfinite(s))
    ok = valid & ~bad
    s = torch.where(ok, s, 1.0)
    log_s = torch.log(s)
    zero = torch.zeros((), dtype=torch.float64, device=top.device)
    entropy = torch.where(ok, (log_s - u / s).clamp(min=0.0), zero)
    logp_ids = torch.where(ok[:, None], z - log_s[:, None], zero)
    log_rest = torch.where(ok, torch.log(sum_rest.double()) - log_s, zero)
    return LogitPass(entropy=entropy, logp_ids=logp_ids, log_rest=log_rest, bad=bad)


def finish_raw(
    top: torch.Tensor,  # (N,) M, the max of x = logits / τ
    x_ids: torch.Tensor,  # (N, K_all) x on the ids
    sum_raw: torch.Tensor,  # (N,) Σ_v e^(τ·(x_v − M))
    temperature: float,  # τ
    skip: torch.Tensor,  # (N,) bool: rows not passed or bad (their results are 0)
) -> torch.Tensor:
    """log softmax(logits) on the ids (N, K_all) in float64: the raw logits are τ·x with max τ·M,
    so log π_raw = τ·(x − M) − log sum_raw."""
    z = x_ids.double() - top.double()[:, None]
    log_norm = torch.log(torch.where(skip, 1.0, sum_raw.double()))
    return torch.where(skip[:, None], 0.0, temperature * z - log_norm[:, None])


@dataclass
class ExactPass:
    """What the exact pass gives per row, in float64; rows not passed hold 0 (and `bad` False)."""

    tv: torch.Tensor  # (N,) ½ Σ_v |μ_v − π_v| in [0, 1]
    kl: torch.Tensor  # (N,) KL(μ ‖ π) ≥ 0 in nats, +inf where μ_v > 0 = π_v for some v
    bad: torch.Tensor  # (N,) bool: a row of either logits holds NaN or +inf, or only −inf


def run_exact(
    pi_logits: torch.Tensor,  # (..., V)
    mu_logits: torch.Tensor,  # (..., V), the same shape; any strides
    temperature: float,
    impl: str,  # "triton" or "torch"
) -> ExactPass:
    """The exact pass of `impl` over every row of both logits, finished (`finish_exact`)."""
    pi_start, mu_start = row_starts(pi_logits), row_starts(mu_logits)
    if impl == "triton":
        parts = exact_pass_op(pi_logits, mu_logits, pi_start, mu_start, float(temperature))
    else:
        parts = exact_pass_torch(pi_logits, mu_logits, pi_start, mu_start, float(temperature))
    return finish_exact(parts, (pi_start >= 0) & (mu_start >= 0))


def finish_exact(
    parts: torch.Tensor,  # (6, N) float32: M_a, S_x, M_b, S_y, KL, Σ|μ − π| (exact_pass.PARTS)
    valid: torch.Tensor,  # (N,) bool: the rows passed
) -> ExactPass:
    """TV = ½ Σ|μ − π| and the pass's KL in float64, clamped to [0, 1] and [0, ∞]. A row is bad
    when an M or an S is not finite (NaN/+inf logits, or a row of only −inf)."""
    top_x, sum_x, top_y, sum_y, kl, abs_diff = parts.double().unbind(0)
    bad = valid & ~(torch.isfinite(top_x) & torch.isfinite(sum_x) & torch.isfinite(top_y) & torch.isfinite(sum_y))
    ok = valid & ~bad
    zero = torch.zeros((), dtype=torch.float64, device=parts.device)
    return ExactPass(
        tv=torch.where(ok, 0.5 * abs_diff, zero).clamp(0.0, 1.0),
        kl=torch.where(ok, kl, zero).clamp(min=0.0),
        bad=bad,
    )


def raise_bad_row(name: str, logits: torch.Tensor, bad: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Raise for the first bad row (`LogitPass.bad`, one host sync), naming `name` and the index
    of the offending element; `rows` (N,): the flat row index of each entry, else bad is per row."""
    found = torch.nonzero(bad)[:1, 0]
    if found.numel():
        row = int(found[0]) if rows is None else int(rows[found[0]])
        check_logit_rows(name, flat_rows(logits, torch.tensor([row], device=logits.device)), logits.shape, row)


__all__ = [
    "KERNELS_ENV",
    "ExactPass",
    "LogitPass",
    "finish",
    "finish_exact",
    "finish_raw",
    "pass_impl",
    "raise_bad_row",
    "row_starts",
    "run_exact",
    "run_pass",
]
