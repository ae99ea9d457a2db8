"""The exact pass as a Triton kernel: exact TV(μ, π) and KL(μ ‖ π) over the whole vocabulary per
row, from π's and μ's logits (..., V), each row of each read in place.

With a = π's logits and b = μ's logits in float32, M_a = max a, x = (a − M_a)·(1/τ),
S_x = Σ e^x, log π = x − log S_x (likewise M_b, y, S_y, log μ for μ):

    KL(μ ‖ π) = Σ_v μ_v ((y_v − log S_y) − (x_v − log S_x))
    TV        = ½ Σ_v |μ_v − π_v|

The first read of both rows finds M and S per lane (online softmax: when a lane's max grows its
sum is rescaled by e^((M_old − M_new)/τ)), combined across lanes at the end. Both sums need the
final normalisers, so the second read, with M and S known, sums μ_v·(log μ_v − log π_v) and
|μ_v − π_v|: **the exact pass reads its logits twice** (four row reads per position). Each term
is a difference of two log-probabilities near 0 where μ_v is large, so a constant offset between
the rows (logits are shift-invariant; engines and trainers often differ by one) costs no digits:
the logits are shifted by their row max before they are scaled, and no large terms cancel. The
scale is a multiplication by 1/τ, computed once on the host (the Python float, rounded to float32
as a kernel argument), as the torch paths do (torch.mul by the same float), so that every path
rounds the scaling the same way.

A token with b_v = −inf (μ_v = 0) adds nothing to the KL; one with b_v finite and a_v = −inf
(μ_v > 0 = π_v) makes it +inf. NaN or +inf logits turn S NaN and a row of only −inf gives
M = −inf (the sums are rescaled by multiplication, so a NaN is never dropped):
`trustlens.divergence.kernels.finish_exact` flags such rows from these values, without another
pass. Offsets are int64; each row is addressed by its element offset in each tensor (−1: skip
the row) and each tensor's vocabulary stride, so views are read in place.
`trustlens.divergence.kernels.exact_pass_reference` computes the same (6, N) parts with torch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from trustlens.core.torch_import import torch

# Logits of each tensor read per loop iteration of one row (elements): a multiple of every warp count used.
BLOCK = 2048

# the rows of the (6, N) float32 parts the pass returns (the maxima in logit units, before 1/τ)
PARTS = ("max_pi", "sum_pi", "max_mu", "sum_mu", "kl", "abs_diff")


@triton.jit
def _online(m, s, v, inv_temperature):
    """One block `v` of logits into a lane's running max `m` and Σ e^((v − m)/τ) `s`: (m_new, s_new)."""
    m_new = tl.maximum(m, v)
    scale = tl.where(m_new > float("-inf"), tl.exp((m - m_new) * inv_temperature), 0.0)  # s · scale keeps a NaN
    e = tl.where(v == float("-inf"), 0.0, tl.exp((v - m_new) * inv_temperature))  # NaN stays NaN: the row is bad
    return m_new, scale * s + e


@triton.jit
def _lane_total(m, s, top, inv_temperature):
    """The lanes' sums `s` (each relative to its lane max `m`) as one sum relative to `top`."""
    alpha = tl.where(m > float("-inf"), tl.exp((m - top) * inv_temperature), 0.0)
    return tl.sum(alpha * s, 0)


@triton.jit
def _exact_pass_kernel(
    pi_ptr,  # the first element of π's logits (its storage offset applied)
    mu_ptr,  # the first element of μ's logits
    pi_start_ptr,  # (N,) int64 element offset of each row in π's logits; −1: skipped
    mu_start_ptr,  # (N,) int64 element offset of each row in μ's logits
    pi_col_stride,  # elements between two tokens of a row of π's logits
    mu_col_stride,
    V,  # vocabulary size
    N,  # rows
    inv_temperature,  # 1/τ, float32
    out_ptr,  # (6, N) float32 out: PARTS
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    pi_start = tl.load(pi_start_ptr + i)
    mu_start = tl.load(mu_start_ptr + i)
    if (pi_start >= 0) & (mu_start >= 0):
        pi_row = pi_ptr + pi_start
        mu_row = mu_ptr + mu_start
        lanes = tl.arange(0, BLOCK)
        ma = tl.full([BLOCK], float("-inf"), tl.float32)
        mb = tl.full([BLOCK], float("-inf"), tl.float32)
        sx = tl.zeros([BLOCK], tl.float32)
        sy = tl.zeros([BLOCK], tl.float32)
        for first in range(0, V, BLOCK):  # first read: the maxima and the normalisers
            cols = (first + lanes).to(tl.int64)
            inside = cols < V
            a = tl.load(pi_row + cols * pi_col_stride, mask=inside, other=float("-inf")).to(tl.float32)
            b = tl.load(mu_row + cols * mu_col_stride, mask=inside, other=float("-inf")).to(tl.float32)
            ma, sx = _online(ma, sx, a, inv_temperature)
            mb, sy = _online(mb, sy, b, inv_temperature)
        top_a = tl.max(ma, 0)
        top_b = tl.max(mb, 0)
        sum_x = _lane_total(ma, sx, top_a, inv_temperature)
        sum_y = _lane_total(mb, sy, top_b, inv_temperature)
        # second read: μ_v (log μ_v − log π_v) and |μ_v − π_v| with the normalisers known
        inv_x = 1.0 / sum_x
        inv_y = 1.0 / sum_y
        log_ratio = tl.log(sum_x) - tl.log(sum_y)  # log S_x − log S_y
        kl = tl.zeros([BLOCK], tl.float32)
        acc = tl.zeros([BLOCK], tl.float32)
        for first in range(0, V, BLOCK):
            cols = (first + lanes).to(tl.int64)
            inside = cols < V
            a = tl.load(pi_row + cols * pi_col_stride, mask=inside, other=float("-inf")).to(tl.float32)
            b = tl.load(mu_row + cols * mu_col_stride, mask=inside, other=float("-inf")).to(tl.float32)
            x = (a - top_a) * inv_temperature
            y = (b - top_b) * inv_temperature
            p = tl.where(a == float("-inf"), 0.0, tl.exp(x)) * inv_x
            q = tl.where(b == float("-inf"), 0.0, tl.exp(y)) * inv_y
            hole = (b > float("-inf")) & (a == float("-inf"))  # μ_v > 0 = π_v
            term = tl.where(q > 0, q * ((y - x) + log_ratio), 0.0)
            kl += tl.where(hole, float("inf"), term)
            acc += tl.abs(q - p)
        tl.store(out_ptr + i, top_a)
        tl.store(out_ptr + N + i, sum_x)
        tl.store(out_ptr + 2 * N + i, top_b)
        tl.store(out_ptr + 3 * N + i, sum_y)
        tl.store(out_ptr + 4 * N + i, tl.sum(kl, 0))
        tl.store(out_ptr + 5 * N + i, tl.sum(acc, 0))


def exact_pass_triton(
    pi_logits: torch.Tensor,  # (..., V) any float dtype, any strides
    mu_logits: torch.Tensor,  # (..., V) any float dtype, any strides
    pi_start: torch.Tensor,  # (N,) int64 element offsets of the rows in pi_logits; −1: skipped
    mu_start: torch.Tensor,  # (N,) int64 element offsets of the same rows in mu_logits
    temperature: float,
) -> torch.Tensor:
    """(6, N) float32: the PARTS of each row, as the module states; skipped rows hold 0."""
    n, V = pi_start.shape[0], pi_logits.shape[-1]
    out = torch.zeros(len(PARTS), n, dtype=torch.float32, device=pi_logits.device)
    if n:
        block = min(BLOCK, triton.next_power_of_2(V))
        _exact_pass_kernel[(n,)](
            pi_logits,
            mu_logits,
            pi_start,
            mu_start,
            pi_logits.stride(-1),
            mu_logits.stride(-1),
            V,
            n,
            1.0 / temperature,
            out,
            BLOCK=block,
            num_warps=8 if block >= 2048 else 4,
        )
    return out
