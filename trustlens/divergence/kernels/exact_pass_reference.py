"""The exact pass in torch: the same (6, N) parts as the Triton kernel
(`trustlens.divergence.kernels.exact_pass`, whose docstring states the math), for CUDA machines
without Triton and for TRUSTLENS_KERNELS=torch. Both logits are read through their rows' element
offsets (views in place) a chunk of rows at a time, so that the extra memory is a few chunks
whatever N is; on CUDA the chunk function is compiled with dynamic shapes.
"""

from __future__ import annotations

import math

from trustlens.core.torch_import import torch
from trustlens.divergence.kernels.logit_pass_reference import by_row_chunks


def _exact_chunk(
    pi_flat: torch.Tensor,  # π's logits' storage seen as 1-D from their first element
    pi_cols: torch.Tensor,  # (V,) int64 element offsets of the tokens in a row of π's logits
    mu_flat: torch.Tensor,
    mu_cols: torch.Tensor,
    pi_start: torch.Tensor,  # (R,) int64; −1: skipped
    mu_start: torch.Tensor,  # (R,) int64
    inv_temperature: float,  # 1/τ
) -> tuple[torch.Tensor]:
    """The parts of R rows, (R, 6); a skipped row reads row 0's place and its parts are zeroed."""
    valid = (pi_start >= 0) & (mu_start >= 0)
    a = pi_flat[pi_start.clamp(min=0)[:, None] + pi_cols[None, :]].float()  # (R, V)
    b = mu_flat[mu_start.clamp(min=0)[:, None] + mu_cols[None, :]].float()  # (R, V)
    top_a, top_b = a.amax(-1), b.amax(-1)  # (R,)
    x = (a - top_a[:, None]) * inv_temperature  # (R, V)
    y = (b - top_b[:, None]) * inv_temperature
    ex = torch.where(a == -math.inf, 0.0, torch.exp(x))  # (R, V); NaN stays NaN
    ey = torch.where(b == -math.inf, 0.0, torch.exp(y))
    sum_x, sum_y = ex.sum(-1), ey.sum(-1)  # (R,)
    p, q = ex / sum_x[:, None], ey / sum_y[:, None]
    log_ratio = (torch.log(sum_x) - torch.log(sum_y))[:, None]  # (R, 1)
    hole = (b > -math.inf) & (a == -math.inf)  # μ_v > 0 = π_v
    kl = torch.where(hole, math.inf, torch.where(q > 0, q * ((y - x) + log_ratio), 0.0)).sum(-1)
    abs_diff = (q - p).abs().sum(-1)
    parts = torch.stack([top_a, sum_x, top_b, sum_y, kl, abs_diff], -1)  # (R, 6)
    return (torch.where(valid[:, None], parts, 0.0),)


def exact_pass_torch(
    pi_logits: torch.Tensor,  # (..., V) any float dtype, any strides
    mu_logits: torch.Tensor,  # (..., V) any float dtype, any strides
    pi_start: torch.Tensor,  # (N,) int64 element offsets of the rows in pi_logits; −1: skipped
    mu_start: torch.Tensor,  # (N,) int64 element offsets of the same rows in mu_logits
    temperature: float,
    *,
    compiled: bool | None = None,  # None: compiled on CUDA only
) -> torch.Tensor:
    """(6, N) float32 parts, as `exact_pass_triton` returns them."""
    empty = torch.zeros(0, 6, dtype=torch.float32, device=pi_logits.device)
    (parts,) = by_row_chunks(
        _exact_chunk,
        (pi_logits, mu_logits),
        (pi_start, mu_start),
        (1.0 / temperature,),
        (empty,),
        compiled=compiled,
    )
    return parts.T  # (6, N)
