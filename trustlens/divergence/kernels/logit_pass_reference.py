"""The logit pass in torch: the same five tensors as the Triton kernel
(`trustlens.divergence.kernels.logit_pass`), for CUDA machines without Triton and for
TRUSTLENS_KERNELS=torch. The rows are read through their element offsets (so views are read in
place) a chunk of rows at a time, so that the extra memory is one chunk whatever N is; on CUDA the
chunk function is compiled with dynamic shapes (one compilation for every batch size), which
fuses the gather, the exps and the sums into one read of the chunk.
"""

from __future__ import annotations

import math

from trustlens.core.torch_import import torch

# Logits per chunk of rows (rows × V): 64 MiB of float32 when the eager path materialises it.
CHUNK_ELEMENTS = 1 << 24

_compiled: dict[str, object] = {}  # a chunk function's name -> it compiled, or None where compiling failed


def _chunk(
    flat: torch.Tensor,  # the logits' storage seen as 1-D from their first element
    cols: torch.Tensor,  # (V,) int64 element offsets of the tokens in a row
    row_start: torch.Tensor,  # (R,) int64; −1: skipped
    ids: torch.Tensor,  # (R, K_all) int64, each in [0, V) (else its x is NaN)
    n_excluded: int,
    temperature: float,
    raw: bool,  # also Σ_v e^(τ·(x_v − M)), the raw logits' normaliser (else 0)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The logit pass of R rows; a skipped row reads row 0's place and its results are zeroed."""
    valid = row_start >= 0
    start = row_start.clamp(min=0)[:, None]
    V = cols.shape[0]
    inside = (ids >= 0) & (ids < V)  # (R, K_all): a bad id reads nothing, its x is NaN
    ids = torch.where(valid[:, None] & inside, ids, V)  # a skipped row's ids may be padding
    inv_temperature = 1.0 / temperature  # the kernel's scale, rounded alike
    x = flat[start + cols[None, :]].float() * inv_temperature  # (R, V)
    x_ids = flat[start + cols[ids.clamp(max=V - 1)]].float() * inv_temperature  # (R, K_all)
    x_ids = torch.where(inside, x_ids, math.nan)
    top = x.amax(-1, keepdim=True)  # (R, 1)
    excluded = torch.zeros(x.shape[0], V + 1, dtype=torch.bool, device=x.device)  # (R, V + 1), V: no token
    excluded = excluded.scatter_(-1, ids[:, :n_excluded], True)[:, :V]
    z = x - top
    p = torch.where(excluded | (x == -math.inf), 0.0, torch.exp(z))
    s = p.sum(-1)
    u = torch.where(p > 0, z * p, 0.0).sum(-1)
    zero = torch.zeros((), dtype=torch.float32, device=x.device)
    s_raw = torch.where(x == -math.inf, 0.0, torch.exp(temperature * z)).sum(-1) if raw else zero
    return (
        torch.where(valid, top[:, 0], zero),
        torch.where(valid, s, zero),
        torch.where(valid, u, zero),
        torch.where(valid[:, None], x_ids, zero),
        torch.where(valid, s_raw, zero),
    )


def compiled_chunk(fn):
    """`fn`, compiled with dynamic shapes on first use where torch.compile works (else eager,
    with a warning); TRUSTLENS_NO_COMPILE=1 keeps it eager."""
    import os

    if os.environ.get("TRUSTLENS_NO_COMPILE"):
        return fn
    if fn.__name__ not in _compiled:
        try:
            _compiled[fn.__name__] = torch.compile(fn, dynamic=True)
        except Exception as err:  # no compiler for this platform
            import warnings

            warnings.warn(f"trustlens: torch.compile unavailable ({err}); the logit pass runs eagerly", stacklevel=3)
            _compiled[fn.__name__] = None
    return _compiled[fn.__name__] or fn


def by_row_chunks(
    fn,  # (flat, cols per tensor of `logits`, *row_args (R, ...), *args) -> tuple of (R, ...) tensors
    logits: tuple[torch.Tensor, ...],  # (..., V) each: read by `fn` in place, from its first element
    row_args: tuple[torch.Tensor, ...],  # (N, ...) each (the rows' element offsets among them): cut by rows
    args: tuple,  # passed as they are
    empty: tuple[torch.Tensor, ...],  # the results of N = 0 rows
    *,
    compiled: bool | None,  # None: compiled on CUDA only
) -> tuple[torch.Tensor, ...]:
    """`fn` over chunks of about CHUNK_ELEMENTS logits (at least one row), its results
    concatenated along the rows. Each tensor of `logits` reaches `fn` as its storage seen as 1-D
    from its first element and the (V,) int64 element offsets of a row's tokens, so that a row
    is gathered through its offset whatever the strides."""
    views = []
    for t in logits:
        span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
        views += [
            t.as_strided((span,), (1,), t.storage_offset()),
            torch.arange(t.shape[-1], device=t.device, dtype=torch.int64) * t.stride(-1),
        ]
    run = compiled_chunk(fn) if (logits[0].is_cuda if compiled is None else compiled) else fn
    rows = max(1, CHUNK_ELEMENTS // logits[0].shape[-1])
    parts = [
        run(*views, *(a[first : first + rows] for a in row_args), *args)
        for first in range(0, row_args[0].shape[0], rows)
    ]
    return tuple(torch.cat(t) for t in zip(*parts, strict=True)) if parts else empty


def logit_pass_torch(
    logits: torch.Tensor,  # (..., V) any float dtype, any strides
    row_start: torch.Tensor,  # (N,) int64 element offsets of the rows; −1: skipped
    ids: torch.Tensor,  # (N, K_all) int64
    n_excluded: int,
    temperature: float,
    raw: bool,  # also sum_raw
    *,
    compiled: bool | None = None,  # None: compiled on CUDA only
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(M, sum_rest, usum_rest, x_ids, sum_raw) as `logit_pass_triton` returns them."""
    empty = torch.zeros(0, dtype=torch.float32, device=logits.device)
    k_empty = torch.zeros(0, ids.shape[1], dtype=torch.float32, device=logits.device)
    parts = by_row_chunks(
        _chunk,
        (logits,),
        (row_start, ids),
        (n_excluded, float(temperature), bool(raw)),
        (empty, empty, empty, k_empty, empty),
        compiled=compiled,
    )
    return parts  # type: ignore[return-value]
