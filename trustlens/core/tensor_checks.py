"""Input checks shared by the math, the rules, the loss and the recorder.

Every check raises a ValueError whose message names the argument, says what was wrong and where
(the index of the first offending element), so that bad input never turns into silently wrong
numbers downstream.
"""

from __future__ import annotations

import math

from trustlens.core.logspace import LOGP_TOLERANCE
from trustlens.core.torch_import import torch


def _first_index(mask: torch.Tensor) -> tuple[int, ...]:
    """The index of the first True element of `mask`, as a tuple of ints."""
    flat = int(torch.nonzero(mask.reshape(-1), as_tuple=False)[0, 0])
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), mask.shape))


def upcast(t: torch.Tensor) -> torch.Tensor:
    """`t` as float32, or float64 when it already is: all math here runs in float32 or wider."""
    return t.double() if t.dtype == torch.float64 else t.float()


def check_tensor(name: str, t: object, *, finite: bool = True, allow: float | None = None) -> torch.Tensor:
    """Require a floating-point tensor with no NaN and no ±inf except the value `allow` (−inf for
    log-probabilities: probability 0; +inf for KL divergences); return it unchanged.

    finite=False skips the NaN/inf scan (a full pass and a bool copy of `t`): for callers that
    check large inputs by blocks with `check_logit_rows` instead.
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    # The sum is finite unless an element is NaN/inf (or the sum overflows): one cheap reduction
    # spares the element-wise scan on the common, clean input.
    sum_dtype = t.dtype if t.dtype == torch.float64 else torch.float32
    if finite and not math.isfinite(float(t.detach().sum(dtype=sum_dtype))):
        bad = ~torch.isfinite(t)
        if allow is not None:
            bad &= t != allow
        if bool(bad.any()):
            what = "NaN" if bool(torch.isnan(t).any()) else ("-inf" if allow == math.inf else "inf")
            _raise_at(name, what, bad, t.shape, 0)
    return t


def _raise_at(name: str, what: str, bad: torch.Tensor, shape: torch.Size, first_row: int) -> None:
    """Raise "name contains what" at the first True of `bad`: a mask shaped like the tensor
    (`shape`), or like a (R, V) block of its rows first_row… seen as (N, V)."""
    idx = _first_index(bad)
    if bad.shape != shape:  # a block of the flattened tensor: map the index back to `shape`
        row = first_row + idx[0]
        lead = torch.unravel_index(torch.tensor(row), shape[:-1]) if len(shape) > 1 else ()
        idx = (*(int(i) for i in lead), idx[-1])
    raise ValueError(
        f"{name} contains {what} ({int(bad.sum())} non-finite values, first at index {idx} of shape {tuple(shape)})"
    )


def check_logit_rows(name: str, rows: torch.Tensor, shape: torch.Size, first_row: int) -> None:
    """Require a block `rows` (R, V) of logits — rows first_row… of a tensor of `shape` seen as
    (N, V) — to hold no NaN or +inf and no row of only −inf, raising like `check_tensor` with
    the index in `shape`. A −inf logit elsewhere is a token of probability 0 (a masked token) and
    is allowed. Large inputs are checked block by block, or only where a cheap statistic (a row
    maximum) is not finite."""
    hi = torch.amax(rows, dim=-1, keepdim=True)
    if not bool(torch.isfinite(hi).all()):
        nan = torch.isnan(rows)
        if bool(nan.any()):
            _raise_at(name, "NaN", nan, shape, first_row)
        posinf = rows == math.inf
        if bool(posinf.any()):
            _raise_at(name, "inf", posinf, shape, first_row)
        _raise_at(name, "a row of only -inf", (hi == -math.inf).expand_as(rows), shape, first_row)


def check_token_ids(name: str, ids: object, vocab_size: int, *, distinct: bool = False) -> torch.Tensor:
    """Require integer token ids in [0, vocab_size); with distinct=True, no id repeated along the
    last dim (one top-K set). Returns them as int64."""
    if not isinstance(ids, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(ids).__name__}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor of token ids, got dtype {ids.dtype}")
    ids = ids.long()
    out = (ids < 0) | (ids >= vocab_size)
    if bool(out.any()):
        idx = _first_index(out)
        raise ValueError(f"{name} holds id {int(ids[idx])} at index {idx}, outside the vocabulary [0, {vocab_size})")
    if distinct and ids.dim() > 0 and ids.shape[-1] > 1:
        ordered = ids.sort(dim=-1).values
        dup = ordered[..., 1:] == ordered[..., :-1]
        if bool(dup.any()):
            idx = _first_index(dup)
            raise ValueError(
                f"{name} repeats id {int(ordered[idx])} in the set at index {idx[:-1]}; "
                "the ids of one top-K set must be distinct"
            )
    return ids


def check_logp(name: str, t: object) -> torch.Tensor:
    """Require log-probabilities (≤ 0; −inf is probability 0, NaN and +inf raise); return them
    upcast and clamped to ≤ 0."""
    t = check_tensor(name, t, allow=-math.inf)
    t = upcast(t)
    top = float(t.detach().max()) if t.numel() else 0.0
    if top > LOGP_TOLERANCE:
        idx = _first_index(t > LOGP_TOLERANCE)
        raise ValueError(
            f"{name} holds positive log-probabilities (e.g. {float(t[idx]):.6g} at index {idx}); "
            "pass log-probabilities, not probabilities or logits"
        )
    return t.clamp(max=0.0) if top > 0 else t  # the clamp pass only where rounding went above 0


def check_same_shape(**tensors: torch.Tensor | None) -> None:
    """Require all given (non-None) tensors to have one shape."""
    shapes = {k: tuple(v.shape) for k, v in tensors.items() if v is not None}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{k} {s}" for k, s in shapes.items())
        raise ValueError(f"shape mismatch: {listed}; these must have the same shape")


def broadcast_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-sequence `(B,)` or per-token `(B, T)` advantages as a tensor shaped like `like` (B, T)."""
    advantages = check_tensor("advantages", advantages)
    if advantages.shape == like.shape:
        return advantages
    if advantages.dim() == 1 and like.dim() >= 1 and advantages.shape[0] == like.shape[0]:
        return advantages.reshape(-1, *([1] * (like.dim() - 1))).expand_as(like)
    raise ValueError(
        f"advantages has shape {tuple(advantages.shape)}; expected per-sequence "
        f"({like.shape[0] if like.dim() else '?'},) or per-token {tuple(like.shape)}"
    )


def check_nonnegative(name: str, t: object, *, allow_inf: bool = False) -> torch.Tensor:
    """Require values ≥ 0 (up to LOGP_TOLERANCE), finite, or +inf too with allow_inf=True (a KL
    divergence where π gives probability 0 to a token μ gave mass to); NaN and −inf raise.
    Returns them upcast and clamped at 0."""
    t = upcast(check_tensor(name, t, allow=math.inf if allow_inf else None))
    neg = t < -LOGP_TOLERANCE
    if bool(neg.any()):
        idx = _first_index(neg)
        raise ValueError(f"{name} holds negative values (e.g. {float(t[idx]):.6g} at index {idx}); a divergence is ≥ 0")
    return t.clamp(min=0.0)


def check_mask(name: str, t: object, like: torch.Tensor) -> torch.Tensor:
    """Require a 0/1 (or bool) mask shaped like `like` and on its device; return it as a bool
    tensor."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != like.device:
        raise ValueError(f"{name} is on device {t.device}; expected {like.device}, the device of the tensors it masks")
    if t.shape != like.shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {tuple(like.shape)}")
    if t.dtype != torch.bool:
        bad = (t != 0) & (t != 1)
        if bool(bad.any()):
            idx = _first_index(bad)
            raise ValueError(f"{name} must hold only 0 and 1, got {float(t[idx]):.6g} at index {idx}")
    return t.bool()


def check_same_device(**tensors: object) -> None:
    """Require the given tensors (non-tensors and None are skipped: their own checks name them)
    to be on one device, raising a ValueError that names each argument's device. Called first,
    before any value check reads the data."""
    devices = {k: v.device for k, v in tensors.items() if isinstance(v, torch.Tensor)}
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{k} on {d}" for k, d in devices.items())
        raise ValueError(f"device mismatch: {listed}; move these tensors to one device")


def check_tv(name: str, t: object) -> torch.Tensor:
    """Require total-variation distances: values in [0, 1] (up to LOGP_TOLERANCE), NaN and ±inf
    raise. Returns them upcast and clamped to [0, 1]."""
    t = check_nonnegative(name, t)
    over = t > 1 + LOGP_TOLERANCE
    if bool(over.any()):
        idx = _first_index(over)
        raise ValueError(
            f"{name} holds values above 1 (e.g. {float(t[idx]):.6g} at index {idx}); a total variation is in [0, 1]"
        )
    return t.clamp(max=1.0)
