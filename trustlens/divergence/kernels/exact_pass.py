"""The exact pass as a Triton kernel: exact TV(μ, π) and KL(μ ‖ π) over the whole vocabulary per
row, from π's and μ's logits (..., V), each row of each read in place.

With x = π's logits / τ and y = μ's logits / τ in float32, M_x = max x, S_x = Σ e^(x − M_x)
(likewise M_y, S_y), π = e^(x − M_x) / S_x and μ = e^(y − M_y) / S_y:

    KL(μ ‖ π) = Σ μ_v (y_v − x_v) − log Σ e^y + log Σ e^x
              = W / S_y + (M_x − M_y) + log S_x − log S_y,    W = Σ_v e^(y_v − M_y) (y_v − x_v)

so one read of both rows gives the KL: per lane a running M_x, S_x, M_y, S_y and W (online
softmax: when a lane's max grows its sums are rescaled by e^(M_old − M_new); y − x needs no
shift), combined across lanes at the end. A token with y_v = −inf (μ_v = 0) adds nothing; one
with y_v finite and x_v = −inf (μ_v > 0 = π_v) makes the KL +inf (W is stored +inf).

    TV = ½ Σ_v |μ_v − π_v|

cannot be summed before both normalisers are known (|a − b| does not factor through a rescaling
of one side), so the kernel reads both rows a second time once M and S are final: **the exact pass
reads its logits twice** (four row reads per position), where the KL alone would need one.

NaN or +inf logits turn S NaN and a row of only −inf gives M = −inf (the sums are rescaled by
multiplication, so a NaN is never dropped): `trustlens.divergence.kernels.finish_exact` flags such
rows from these values, without another pass. Offsets are int64; each row is addressed by its
element offset in each tensor (−1: skip the row) and each tensor's vocabulary stride, so views
are read in place. `trustlens.divergence.kernels.exact_pass_reference` computes the same (6, N)
parts with torch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from trustlens.core.torch_import import torch

# Logits of each tensor read per loop iteration of one row (elements): a multiple of every warp count used.
BLOCK = 2048

# the rows of the (6, N) float32 parts the pass returns
PARTS = ("max_pi", "sum_pi", "max_mu", "sum_mu", "w", "abs_diff")


@triton.jit
def _online(m, s, v):
    """One block `v` into a lane's running max `m` and Σ e^(v − m) `s`: (m_new, s_new, scale)."""
    m_new = tl.maximum(m, v)
    scale = tl.where(m_new > float("-inf"), tl.exp(m - m_new), 0.0)  # s · scale keeps a NaN
    e = tl.where(v == float("-inf"), 0.0, tl.exp(v - m_new))  # NaN stays NaN: the row is bad
    return m_new, scale * s + e, scale, e


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
    temperature,  # τ > 0, applied in float32
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
        mx = tl.full([BLOCK], float("-inf"), tl.float32)
        my = tl.full([BLOCK], float("-inf"), tl.float32)
        sx = tl.zeros([BLOCK], tl.float32)
        sy = tl.zeros([BLOCK], tl.float32)
        w = tl.zeros([BLOCK], tl.float32)
        hole = tl.zeros([BLOCK], tl.int32)  # 1: a token with μ > 0 = π in this lane
        for first in range(0, V, BLOCK):
            cols = (first + lanes).to(tl.int64)
            inside = cols < V
            x = tl.load(pi_row + cols * pi_col_stride, mask=inside, other=float("-inf")).to(tl.float32) / temperature
            y = tl.load(mu_row + cols * mu_col_stride, mask=inside, other=float("-inf")).to(tl.float32) / temperature
            mx, sx, _, _ = _online(mx, sx, x)
            my, sy, scale_y, ey = _online(my, sy, y)
            x_live = x > float("-inf")
            w = scale_y * w + tl.where((ey > 0) & x_live, ey * (y - x), 0.0)
            hole = tl.maximum(hole, ((y > float("-inf")) & (x == float("-inf"))).to(tl.int32))
        top_x = tl.max(mx, 0)
        top_y = tl.max(my, 0)
        alpha_x = tl.where(mx > float("-inf"), tl.exp(mx - top_x), 0.0)
        alpha_y = tl.where(my > float("-inf"), tl.exp(my - top_y), 0.0)
        sum_x = tl.sum(alpha_x * sx, 0)
        sum_y = tl.sum(alpha_y * sy, 0)
        w_row = tl.sum(alpha_y * w, 0)
        w_row = tl.where(tl.max(hole, 0) > 0, float("inf"), w_row)
        # second read: Σ |μ_v − π_v| with the normalisers known
        inv_x = 1.0 / sum_x
        inv_y = 1.0 / sum_y
        acc = tl.zeros([BLOCK], tl.float32)
        for first in range(0, V, BLOCK):
            cols = (first + lanes).to(tl.int64)
            inside = cols < V
            x = tl.load(pi_row + cols * pi_col_stride, mask=inside, other=float("-inf")).to(tl.float32) / temperature
            y = tl.load(mu_row + cols * mu_col_stride, mask=inside, other=float("-inf")).to(tl.float32) / temperature
            p = tl.where(x == float("-inf"), 0.0, tl.exp(x - top_x)) * inv_x
            q = tl.where(y == float("-inf"), 0.0, tl.exp(y - top_y)) * inv_y
            acc += tl.abs(q - p)
        tl.store(out_ptr + i, top_x)
        tl.store(out_ptr + N + i, sum_x)
        tl.store(out_ptr + 2 * N + i, top_y)
        tl.store(out_ptr + 3 * N + i, sum_y)
        tl.store(out_ptr + 4 * N + i, w_row)
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
            float(temperature),
            out,
            BLOCK=block,
            num_warps=8 if block >= 2048 else 4,
        )
    return out
