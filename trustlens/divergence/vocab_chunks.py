"""Passes over the vocabulary of logits (..., V), a chunk of rows at a time: the machinery behind
the full-vocabulary functions of trustlens.divergence.

Row iteration: `row_blocks` views tensors of one leading shape as 2-D (rows, V) blocks without a
copy, `row_chunks` cuts those into chunks of about `CHUNK_ELEMENTS` elements (at least one row),
`flat_rows` copies out a few rows by flat index, and `check_row_maxima` raises for the first row
that is not finite (NaN, +inf or only −inf).

`logp_on_ids`: log softmax(logits / τ) on a few ids per row and on the rest bucket (every other
token), in float64, from one exp-and-sum pass over the vocabulary instead of a (N, V)
log-softmax: extra memory O(N·K) plus one chunk. On large float32 inputs, blocks of flat rows go
to a torch.compile'd one-pass exp-sum kernel (`_fused_exp_sum`; compiled on first use, cached on
disk by torch); peaked rows, small inputs, and machines where torch.compile fails (a warning
says so) or TRUSTLENS_NO_COMPILE=1 use the eager chunk loop, with the same results to float32
rounding.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from trustlens.core.tensor_checks import check_logit_rows
from trustlens.core.torch_import import torch

# Elements of one chunk of rows (1 MiB of float32): small enough to stay in a core's L2 cache.
# A row longer than this is processed alone.
CHUNK_ELEMENTS = 1 << 18

# When the largest logit/τ among μ's top-K ids lies in this range, π's exps are taken without a
# shift: their total is ≥ e^-20, far above float32's underflow, and a logit up to 88 fits.
_NO_SHIFT = (-20.0, 50.0)

# A rest-bucket sum below this may have lost digits to float32 underflow (exps below 1e-38):
# such rows get an exact log-softmax recomputation.
_UNDERFLOW = 1e-25

# Inputs of at least this many logits may take the compiled one-pass kernel (`_exp_sum`), when
# torch.compile works here: its compile step (seconds, once per process and dtype) pays off only
# on large inputs. Set TRUSTLENS_NO_COMPILE=1 to always use the eager chunk loop.
COMPILE_MIN_ELEMENTS = 1 << 24

# The compiled kernel sums exp over the whole row, so the rest bucket is total − Σ_S exp. That
# subtraction loses at most one bit when rest ≥ total / 2: rows where μ's rest mass is at least
# this are sent to it, and rows where π's rest then falls below it are recomputed exactly.
_FUSED_MIN_REST = 0.5

_compiled: dict[str, object] = {}  # "exp_sum": the compiled kernel, or None where compiling failed


def row_blocks(*tensors: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
    """Aligned 2-D (rows, V) views of tensors that share their leading dims, in row-major order.

    A tensor whose leading dims cannot be flattened without a copy (e.g. logits[:, :-1]) is split
    along dim 0 until they can, so no block is ever copied.
    """
    try:
        views = tuple(t.view(-1, t.shape[-1]) for t in tensors)
    except RuntimeError:
        views = None
    if views is not None:
        yield views
        return
    for parts in zip(*(t.unbind(0) for t in tensors), strict=True):
        yield from row_blocks(*parts)


def rows_per_chunk(vocab: int) -> int:
    """The rows of a chunk of `vocab` (V) columns: max(1, CHUNK_ELEMENTS // V)."""
    return max(1, CHUNK_ELEMENTS // vocab)


def row_chunks(*tensors: torch.Tensor, rows: int = 0) -> Iterator[tuple[int, tuple[torch.Tensor, ...]]]:
    """(first row, aligned chunks of at most `rows` rows, by default max(1, CHUNK_ELEMENTS // V))
    over the rows of tensors of one shape (..., V)."""
    rows = rows or rows_per_chunk(tensors[0].shape[-1])
    first = 0
    for block in row_blocks(*tensors):
        for start in range(0, block[0].shape[0], rows):
            chunk = tuple(b[start : start + rows] for b in block)
            yield first, chunk
            first += chunk[0].shape[0]


def flat_rows(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows (len(rows), V) of t (..., V) seen as (N, V), by flat row index, copying only them."""
    if t.dim() == 1:
        return t.unsqueeze(0)[rows]
    return t[torch.unravel_index(rows, t.shape[:-1])]


def check_row_maxima(name: str, logits: torch.Tensor, maxima: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Raise for the first row of logits (..., V) whose maximum is not finite (NaN, +inf or a row
    of only −inf), with the index of the offending element. maxima: (N,), or one per flat row
    index in `rows`."""
    bad = torch.nonzero(~torch.isfinite(maxima))[:, 0]
    if bad.numel():
        row = int(bad[0]) if rows is None else int(rows[bad[0]])
        check_logit_rows(name, flat_rows(logits, torch.tensor([row])), logits.shape, row)


def _exp_sum(x: torch.Tensor, shift: torch.Tensor, inv_temperature: torch.Tensor) -> torch.Tensor:
    """Σ_v exp((x_v − shift)·inv_temperature) per row of x (R, V), any float dtype, in float32:
    the upcast, shift, scale, exp and sum fuse into one read pass when compiled. shift: (R,)."""
    return torch.exp((x.float() - shift[:, None]) * inv_temperature).sum(-1)


def _fused_exp_sum(x: torch.Tensor, shift: torch.Tensor, inv_temperature: torch.Tensor) -> torch.Tensor | None:
    """`_exp_sum` compiled (once per process and dtype, plus once more with dynamic shapes when a
    second shape comes), or None when torch.compile is unavailable or disabled here: the caller
    then runs the eager loop."""
    import os

    if os.environ.get("TRUSTLENS_NO_COMPILE") or _compiled.get("exp_sum", True) is None:
        return None
    try:
        if "exp_sum" not in _compiled:  # static shapes first; a new shape recompiles once, dynamic
            _compiled["exp_sum"] = torch.compile(_exp_sum, fullgraph=True)
        return _compiled["exp_sum"](x, shift, inv_temperature)  # type: ignore[operator]
    except Exception as err:  # no C++ compiler, an unsupported platform, ...: stay eager
        import warnings

        _compiled["exp_sum"] = None
        warnings.warn(f"trustlens: torch.compile unavailable ({err}); using the eager divergence loop", stacklevel=3)
        return None


def logp_on_ids(
    name: str,
    logits: torch.Tensor,
    ids: torch.Tensor,
    temperature: float,
    dtype: torch.dtype,
    expected_log_rest: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / τ) on `ids` (N, K) and on the rest bucket (N,), float64, without a
    log-softmax of the vocabulary.

    logits: (..., V) with N rows, any float dtype; ids: (N, K) int64, distinct per row.
    One pass over the vocabulary: per chunk of rows, exp((logits − s)/τ) into a scratch chunk, the
    ids zeroed, summed, so that rest = Σ_{j∉ids} exp keeps its relative precision however small it
    is (instead of being 1 − Σ_ids). Then total = rest + Σ_ids exp, log π_ids = (x_ids − s)/τ −
    log total, log π_rest = log rest − log total (−inf when the ids cover the vocabulary).

    The shift s needs no max pass: c = max over the ids of logits/τ (a gather) bounds the total
    from below (total ≥ exp(c − s/τ)), so s = 0 when c ∈ _NO_SHIFT (exp runs on the logits as
    they are) and s = τ·c otherwise. Rows where that guess fails — exp overflowed (π's max far
    above its logits on the ids), rest underflowed, or the input is not finite — are redone
    exactly with a log-softmax of the row, which also reports NaN/inf; `name` names logits in
    that report. Extra memory: O(N·K) plus one chunk.

    expected_log_rest (N,): log of the mass each row is expected to keep outside the ids (μ's
    rest bucket, for π's logits). Rows where it is at least log _FUSED_MIN_REST may take the
    compiled kernel: on large float32 work, a block of rows that are all such rows gets one fused
    pass, no scratch, rest = total − Σ_ids exp; a row whose rest falls below _FUSED_MIN_REST of
    its total is redone exactly.
    """
    V, K, n = logits.shape[-1], ids.shape[-1], ids.shape[0]
    on_ids = logits.gather(-1, ids.reshape(*logits.shape[:-1], K)).reshape(n, K).to(dtype)
    top = on_ids.amax(-1) / temperature  # (N,) c
    shift = torch.where((top >= _NO_SHIFT[0]) & (top <= _NO_SHIFT[1]), 0.0, top * temperature)
    shift = shift.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)[:, None]  # bad rows are redone
    rest = torch.empty(n, dtype=dtype, device=logits.device)  # Σ_{j∉ids} exp((x_j − s)/τ)
    # rows whose rest comes from the compiled total: the total until the ids are taken out below
    fused = torch.zeros(n, dtype=torch.bool, device=logits.device)
    if expected_log_rest is not None and dtype == torch.float32 and n * V >= COMPILE_MIN_ELEMENTS:
        _fused_totals(logits, shift, temperature, expected_log_rest >= math.log(_FUSED_MIN_REST), rest, fused)
    _chunked_rest(logits, ids, shift, temperature, rest, fused)
    # (N, K) sized from here on, in float64. log total = top + log1p(everything else / e^top),
    # so that a token with π = 1 − 1e-12 gets log π = −1e-12, not a rounded 0.
    rest = rest.double()
    z_ids = (on_ids.double() - shift.double()) / temperature  # (N, K)
    if bool(fused.any()):  # the compiled totals hold the ids too: take them out
        total = rest
        rest = torch.where(fused, total - z_ids.exp().sum(-1), total)
        cancelled = fused & ~(rest >= _FUSED_MIN_REST * total)
        rest = torch.where(cancelled, math.nan, rest)  # redone exactly below
    top_z, top_at = z_ids.max(-1, keepdim=True)  # (N, 1)
    others = (z_ids - top_z).exp().scatter(-1, top_at, 0.0).sum(-1) + rest * torch.exp(-top_z[:, 0])
    log_total = top_z[:, 0] + torch.log1p(others)  # (N,)
    log_ids, log_rest = z_ids - log_total[:, None], torch.log(rest) - log_total
    redo = ~torch.isfinite(top) | ~torch.isfinite(rest)
    if K < V:
        redo |= rest < _UNDERFLOW
    _redo_exactly(name, logits, ids, temperature, redo, log_ids, log_rest)
    return log_ids, log_rest


def _fused_totals(
    logits: torch.Tensor,
    shift: torch.Tensor,
    temperature: float,
    fused_rows: torch.Tensor,
    rest: torch.Tensor,
    fused: torch.Tensor,
) -> None:
    """`logp_on_ids`' compiled pass: each block of rows that are all `fused_rows` (N,) gets its
    totals Σ_j exp((x_j − s)/τ), the ids included, written into `rest` (N,) and marked in `fused`
    (N,); stops at the first block the compiled kernel does not take. shift: (N, 1) s."""
    inv_t = torch.tensor(1.0 / temperature, device=logits.device)
    first = 0
    for (block,) in row_blocks(logits):
        rows = slice(first, first + block.shape[0])
        if bool(fused_rows[rows].all()):
            total = _fused_exp_sum(block, shift[rows, 0].to(rest.dtype), inv_t)
            if total is None:
                break
            rest[rows], fused[rows] = total, True
        first += block.shape[0]


def _chunked_rest(
    logits: torch.Tensor,
    ids: torch.Tensor,
    shift: torch.Tensor,
    temperature: float,
    rest: torch.Tensor,
    fused: torch.Tensor,
) -> None:
    """`logp_on_ids`' pass over the vocabulary: rest = Σ_{j∉ids} exp((x_j − s)/τ) into `rest` (N,)
    for every row not `fused` (N,), per chunk of rows: exp into one scratch chunk, the ids (N, K)
    zeroed, summed. shift: (N, 1) s."""
    dtype, V = rest.dtype, logits.shape[-1]
    unshifted = (shift[:, 0] == 0).tolist()
    scratch = torch.empty(min(ids.shape[0], rows_per_chunk(V)), V, dtype=dtype, device=logits.device)
    unfused = (~fused).tolist()
    for first, (chunk,) in row_chunks(logits):
        last = first + chunk.shape[0]
        if not any(unfused[first:last]):
            continue
        z = scratch[: chunk.shape[0]]
        src = chunk  # each step below is one pass, taken only when needed
        if chunk.dtype != dtype:
            src = z.copy_(chunk)  # upcast (a mixed-dtype sub would be slower)
        if not all(unshifted[first:last]):
            src = torch.sub(src, shift[first:last], out=z)
        if temperature != 1.0:
            src = torch.mul(src, 1.0 / temperature, out=z)  # as the kernels scale
        torch.exp(src, out=z)
        z.scatter_(-1, ids[first:last], 0.0)
        torch.sum(z, -1, out=rest[first:last])


def _redo_exactly(
    name: str,
    logits: torch.Tensor,
    ids: torch.Tensor,
    temperature: float,
    redo: torch.Tensor,
    log_ids: torch.Tensor,
    log_rest: torch.Tensor,
) -> None:
    """The rows `redo` (N,) of `log_ids` (N, K) and `log_rest` (N,) again from a float64
    log-softmax of each row, by chunks of rows; a NaN/inf row of `logits` is reported under `name`."""
    for part in torch.nonzero(redo)[:, 0].split(rows_per_chunk(logits.shape[-1])):  # rare
        x = flat_rows(logits, part)
        check_row_maxima(name, logits, x.amax(-1), part)
        log_pi = torch.log_softmax(x.double() / temperature, -1)
        log_ids[part] = log_pi.gather(-1, ids[part])
        log_rest[part] = log_pi.scatter(-1, ids[part], -math.inf).logsumexp(-1)
