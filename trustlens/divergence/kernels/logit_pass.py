"""The logit pass as a Triton kernel: one read of each valid row of π's logits (..., V).

Per row, with x = logits·(1/τ) in float32 and M = max_v x_v (every token counts in M):

    sum_rest  = Σ_{v∉E} e^(x_v − M)                 (E: the row's excluded ids, μ's top-K set)
    usum_rest = Σ_{v∉E} (x_v − M) e^(x_v − M)
    x_ids     = x on the row's ids (gathered, E first)
    sum_raw   = Σ_v e^(τ·(x_v − M))                  (RAW only: every token; 0 otherwise)

sum_raw normalises the raw logits τ·x, the distribution before the sampling temperature: their
max is τ·M, so the running max of x serves both sums and only the sum is new (same read).

The sums run per lane with a running max (online softmax: a lane's sums are rescaled by
e^(m_old − m_new) when its max grows) and are combined across lanes at the end, so the row is read
once. A −inf logit adds 0; NaN or +inf turn the sums NaN and a row of only −inf gives M = −inf:
`trustlens.divergence.kernels.finish` finds such rows from these values. E is left out of the
sums element by element (not subtracted afterwards), so that a rest mass far below the top-K's
keeps its relative precision: the wrapper hands the kernel each row's E sorted, and the block
loop walks it, so that each excluded id is loaded once per row. Offsets are int64; rows are
addressed by their element offset (`row_start`, −1: skip the row) and the vocabulary stride, so
views are read in place.

The scale is a multiplication by 1/τ, computed once on the host (the Python float, rounded to
float32 as a kernel argument), as the torch paths do, so that every path rounds it the same way.
Precondition on the ids: each in [0, V) (the public functions check them); the gather is masked
all the same, so that a bad id reads no memory outside the row: its x is NaN.

`trustlens.divergence.kernels.logit_pass_reference` computes the same five tensors with torch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from trustlens.core.torch_import import torch

# Logits read per loop iteration of one row (elements): a multiple of every warp count used.
BLOCK = 4096


@triton.jit
def _logit_pass_kernel(
    logits_ptr,  # the first element of the logits tensor (its storage offset applied)
    row_start_ptr,  # (N,) int64 element offset of each row; −1: not a valid row, skipped
    col_stride,  # elements between two tokens of a row
    V,  # vocabulary size
    ids_ptr,  # (N, K_ALL) int64 ids to gather, each in [0, V) (else its x is NaN)
    excl_ptr,  # (N, K_EXCL) int64 the ids left out of the sums, ascending per row
    K_ALL,
    K_EXCL,
    temperature,  # τ > 0, float32 (the raw logits' scale)
    inv_temperature,  # 1/τ, float32
    max_ptr,  # (N,) float32 out: M
    sum_ptr,  # (N,) float32 out: sum_rest
    usum_ptr,  # (N,) float32 out: usum_rest
    x_ids_ptr,  # (N, K_ALL) float32 out: x on the ids
    raw_ptr,  # (N,) float32 out: sum_raw (written when RAW)
    BLOCK: tl.constexpr,
    RAW: tl.constexpr,  # also sum the raw logits' exps (τ ≠ 1 and wanted)
):
    i = tl.program_id(0).to(tl.int64)
    start = tl.load(row_start_ptr + i)
    if start >= 0:
        row_ptr = logits_ptr + start
        ids_row = ids_ptr + i * K_ALL
        excl_row = excl_ptr + i * K_EXCL
        lanes = tl.arange(0, BLOCK)
        past = V + BLOCK  # beyond every block: the next id once all are taken
        j = 0  # the next excluded id, loaded once: excl_row[j], or `past` after the last
        next_id = tl.load(excl_row + j, mask=j < K_EXCL, other=past)
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        u = tl.zeros([BLOCK], tl.float32)
        r = tl.zeros([BLOCK], tl.float32)
        for first in range(0, V, BLOCK):
            cols = first + lanes
            x = tl.load(row_ptr + cols.to(tl.int64) * col_stride, mask=cols < V, other=float("-inf"))
            x = x.to(tl.float32) * inv_temperature
            m_new = tl.maximum(m, x)
            if RAW:  # every token, before the excluded ids are set to −inf
                live_raw = m_new > float("-inf")
                p_raw = tl.where(x == float("-inf"), 0.0, tl.exp(temperature * (x - m_new)))
                r = tl.where(live_raw, tl.exp(temperature * (m - m_new)), 0.0) * r + p_raw
            while next_id < first + BLOCK:  # the excluded ids in this block: −inf for the sums
                x = tl.where(cols == next_id, float("-inf"), x)
                j += 1
                next_id = tl.load(excl_row + j, mask=j < K_EXCL, other=past)
            live = m_new > float("-inf")
            scale = tl.where(live, tl.exp(m - m_new), 0.0)
            p = tl.where(x == float("-inf"), 0.0, tl.exp(x - m_new))  # NaN stays NaN: the row is bad
            u = scale * (u + tl.where(s > 0, (m - m_new) * s, 0.0)) + tl.where(p > 0, (x - m_new) * p, 0.0)
            s = scale * s + p
            m = m_new
        top = tl.max(m, 0)
        alpha = tl.where(m > float("-inf"), tl.exp(m - top), 0.0)
        tl.store(max_ptr + i, top)
        tl.store(sum_ptr + i, tl.sum(alpha * s, 0))
        tl.store(usum_ptr + i, tl.sum(alpha * (u + tl.where(s > 0, (m - top) * s, 0.0)), 0))
        if RAW:
            alpha_raw = tl.where(m > float("-inf"), tl.exp(temperature * (m - top)), 0.0)
            tl.store(raw_ptr + i, tl.sum(alpha_raw * r, 0))
        for k in range(K_ALL):
            idk = tl.load(ids_row + k)
            ok = (idk >= 0) & (idk < V)
            xk = tl.load(row_ptr + idk * col_stride, mask=ok, other=float("nan")).to(tl.float32)
            tl.store(x_ids_ptr + i * K_ALL + k, xk * inv_temperature)


def logit_pass_triton(
    logits: torch.Tensor,  # (..., V) any float dtype, any strides
    row_start: torch.Tensor,  # (N,) int64 element offsets of the rows; −1: skipped
    ids: torch.Tensor,  # (N, K_all) int64, each in [0, V) (else its x is NaN)
    n_excluded: int,  # the first n_excluded ids of each row (distinct) are left out of the sums
    temperature: float,
    raw: bool,  # also sum_raw (else it holds 0)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(M (N,), sum_rest (N,), usum_rest (N,), x_ids (N, K_all), sum_raw (N,)) float32, as
    the module states; skipped rows hold 0."""
    n, k_all = ids.shape
    V = logits.shape[-1]
    outs = [torch.zeros(n, dtype=torch.float32, device=logits.device) for _ in range(4)]
    x_ids = torch.zeros(n, k_all, dtype=torch.float32, device=logits.device)
    if n:
        block = min(BLOCK, triton.next_power_of_2(V))
        excluded = ids[:, :n_excluded].sort(-1).values.contiguous()  # (N, K_excl) ascending
        _logit_pass_kernel[(n,)](
            logits,
            row_start,
            logits.stride(-1),
            V,
            ids,
            excluded,
            k_all,
            n_excluded,
            float(temperature),
            1.0 / temperature,
            *outs[:3],
            x_ids,
            outs[3],
            BLOCK=block,
            RAW=bool(raw),
            num_warps=8 if block >= 2048 else 4,
        )
    return outs[0], outs[1], outs[2], x_ids, outs[3]
