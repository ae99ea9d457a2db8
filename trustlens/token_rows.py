"""The rows of one `TokenRecorder.record` call: checked and copied in the caller's thread, taken
at the valid positions and derived where the rows are made (the writer thread for CPU tensors).

The caller pays for one copy and one check of its per-token inputs: the float inputs are stacked
into one (F, B, T) tensor (the snapshot the rows are later taken from, so the caller may reuse its
tensors as soon as `record` returns), and one min and one max per input over every position
decide whether all values are allowed. Only when they are not (bad input, or a padding holding
NaN, ±inf or out-of-range values) are the inputs checked one by one at the valid positions, which
names the argument and the (b, t) index of the first bad value. Selecting the valid positions
(nonzero, gathers) and deriving the columns happen in `derive_rows`. Measured with
benchmarks/recorder.py's 64 × 1024 batches: this costs the caller about half of what taking the
rows and checking each input on its own did.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from trustlens import _logspace
from trustlens._checks import LOGP_TOLERANCE, _first_index, check_logp, check_nonnegative, check_tensor
from trustlens.rules import Rule, TokenInputs
from trustlens.run.aggregates import Keep, keep_rows
from trustlens.run.writer import TokenBatch

_LOGP = ("pi_logp", "mu_logp", "old_logp")
_DIVERGENCES = ("entropy", "topk_tv", "topk_kl")


def _allowed(name: str, lo: float, hi: float) -> bool:
    """Whether an input whose values span [lo, hi] holds only allowed values (NaN fails every
    test): log-probabilities ≤ LOGP_TOLERANCE (−inf is probability 0), finite advantages, and
    divergences ≥ −LOGP_TOLERANCE and finite, +inf allowed for topk_kl (π = 0 < μ)."""
    if name in _LOGP:
        return hi <= LOGP_TOLERANCE
    if name == "advantages":
        return math.isfinite(lo) and math.isfinite(hi)
    return lo >= -LOGP_TOLERANCE and (name == "topk_kl" or hi < math.inf)


# the check of each input one by one, naming the argument and the index of a bad value
_CHECKS: dict[str, Callable[..., torch.Tensor]] = {
    "advantages": check_tensor,
    "entropy": check_nonnegative,
    "topk_tv": check_nonnegative,
    "topk_kl": functools.partial(check_nonnegative, allow_inf=True),
}


@dataclass
class TokenRows:
    """One `record` call's checked inputs, copied: nothing here aliases the caller's tensors."""

    mask: torch.Tensor  # (B, T) bool: the valid positions
    token_ids: torch.Tensor  # (B, T) int32
    samples: torch.Tensor  # (B,) int64 sample ids
    groups: torch.Tensor  # (B,) int64 group ids
    names: list[str]  # the per-token inputs in `values`: _LOGP, _DIVERGENCES, "advantages"
    values: torch.Tensor  # (F, B, T) float32 (float64 when an input is): those inputs, checked
    decided_rules: list[str]  # the rules the caller decided itself
    decided: torch.Tensor | None  # (R, B, T) bool: their decisions, in that order (None: no rule)
    sequence_advantages: torch.Tensor | None  # (B,) per-sequence advantages; None: "advantages" in `values`


def checked_values(columns: Mapping[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """The per-token inputs `columns` {name: (B, T) float} stacked into one (F, B, T) copy on the
    mask's device, float32 (float64 when one is); log-probabilities in (0, LOGP_TOLERANCE]
    clamped to 0 and divergences in [−LOGP_TOLERANCE, 0) to 0. Raises ValueError naming the
    argument and the (b, t) index of the first value not allowed at a valid position.

    The padding is copied as it is (the rows are taken at the valid positions only), and the
    check looks at every position first: one min and one max per input. Only when a value is
    not allowed somewhere (bad input, or padding holding NaN, ±inf or out-of-range values) are
    the inputs checked one by one at their valid positions."""
    dtype = torch.float64 if any(t.dtype == torch.float64 for t in columns.values()) else torch.float32
    values = torch.stack([t.detach().to(mask.device, dtype) for t in columns.values()])  # (F, B, T)
    if not values.numel():
        return values
    flat = values.reshape(len(values), -1)
    bounds = list(zip(flat.amin(1).tolist(), flat.amax(1).tolist(), strict=True))  # NaN where a NaN is
    if not all(_allowed(name, lo, hi) for name, (lo, hi) in zip(columns, bounds, strict=True)):
        for name, t in columns.items():  # raises at the first bad value at a valid position
            _CHECKS.get(name, check_logp)(name, t.to(mask.device).masked_fill(~mask, 0))
    for row, name, (lo, hi) in zip(values, columns, bounds, strict=True):
        if name in _LOGP and not hi <= 0:
            row.clamp_(max=0.0)
        elif name in _DIVERGENCES and not lo >= 0:
            row.clamp_(min=0.0)
    return values


def checked_token_ids(token_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`token_ids` (B, T) as an int32 copy on the mask's device (the run stores int32 ids);
    ValueError when a valid position holds an id outside [0, 2³¹). The padding may hold any id:
    copied as it is, or as 0 where it does not fit int32."""
    ids = token_ids.to(mask.device)
    lo, hi = check_token_range(ids, mask, 2**31)
    if lo < -(2**31) or hi >= 2**31:
        ids = ids.masked_fill(~mask, 0)
    return ids.to(torch.int32, copy=True)


def check_token_range(ids: torch.Tensor, mask: torch.Tensor, high: int, why: str = "") -> tuple[int, int]:
    """ValueError when a valid position of `ids` (B, T) holds an id outside [0, `high`) (`why`:
    where that bound comes from, for the message). Returns (min, max) over every position."""
    if not ids.numel():
        return 0, 0
    lo, hi = (int(v) for v in torch.aminmax(ids))
    if lo < 0 or hi >= high:  # somewhere: at a valid position?
        bad = mask & ((ids < 0) | (ids >= high))
        if bool(bad.any()):
            raise ValueError(
                f"token_ids holds id {int(ids[bad][0])} at (b, t) = {_first_index(bad)}, a valid "
                f"position; ids must be in [0, {high}){why}"
            )
    return lo, hi


@torch.no_grad()
def derive_rows(
    step: int, update: int, rows: TokenRows, rules: list[Rule], evaluable: list[Rule], keep: Keep | None, rank: int
) -> TokenBatch:
    """The TokenBatch of `rows`: one row per valid position (N), with its ids, float columns and
    the decision of every evaluable rule (the caller's where given, else evaluated here; the
    others stay null), moved to the CPU; the ratio π/anchor and binary TV and KL derived from the
    float32 log-probs with numpy (`_logspace.derived_columns`, as the reader derives them for
    sampled runs: numpy's small-array work holds the GIL once instead of handing it over at each
    torch op, which would slow a Python-bound training loop while this runs in the writer thread).
    Sampled under `keep` when given."""
    b, t = torch.nonzero(rows.mask, as_tuple=True)  # (N,) each
    index = b * rows.mask.shape[1] + t  # (N,) flat positions
    taken = rows.values.reshape(len(rows.names), -1).index_select(1, index)  # (F, N)
    values = dict(zip(rows.names, taken.unbind(0), strict=True))
    if rows.sequence_advantages is not None:
        values["advantages"] = rows.sequence_advantages.index_select(0, b)
    decisions = {}
    if rows.decided is not None:
        taken_decisions = rows.decided.reshape(len(rows.decided_rules), -1).index_select(1, index)  # (R, N)
        decisions = dict(zip(rows.decided_rules, taken_decisions.unbind(0), strict=True))
    pending = [r for r in evaluable if r.name not in decisions]
    if pending:
        inputs = TokenInputs(
            pi_logp=values["pi_logp"],
            mu_logp=values["mu_logp"] if "mu_logp" in values else values["old_logp"],
            advantages=values["advantages"],
            old_logp=values.get("old_logp"),
            topk_tv=values.get("topk_tv"),
            topk_kl=values.get("topk_kl"),
        )
        decisions.update({r.name: inputs.blocked(r) for r in pending})
    ints = [
        rows.samples.index_select(0, b),
        rows.groups.index_select(0, b),
        t,
        rows.token_ids.reshape(-1)[index].long(),
    ]
    names = ("mu_logp", "old_logp", "pi_logp", "topk_tv", "topk_kl", "entropy")
    floats = {**{k: values.get(k) for k in names}, "advantage": values["advantages"]}
    batch = _to_cpu(step, update, ints, floats, {r.name: decisions.get(r.name) for r in rules})
    f = batch.floats
    anchor = f["mu_logp"] if f["mu_logp"] is not None else f["old_logp"]
    assert f["pi_logp"] is not None and anchor is not None  # record requires them
    batch.floats = {**f, **_logspace.derived_columns(f["pi_logp"], anchor)}
    return keep_rows(batch, keep, [r.name for r in rules], rank)


def _to_cpu(step: int, update: int, ints: list[torch.Tensor], floats: dict, blocked: dict) -> TokenBatch:
    """The rows as CPU numpy arrays. Every tensor here was made by `record` or `derive_rows` (none
    aliases the caller's), so on the CPU they are handed over without a copy; from another device
    they move in three transfers: ints (sample, group, pos, token_id), floats, rule decisions."""
    present = [k for k, v in floats.items() if v is not None]
    decided = [k for k, v in blocked.items() if v is not None]
    columns = [ints, [floats[k].float() for k in present], [blocked[k] for k in decided]]
    if ints[0].device.type == "cpu":
        arrays, values, bools = ([t.numpy() for t in group] for group in columns)
    else:
        arrays, values, bools = ([*torch.stack(group).cpu().numpy()] if group else [] for group in columns)
    return TokenBatch(
        step=step,
        update=update,
        sample=arrays[0],
        group=arrays[1],
        pos=arrays[2],
        token_id=arrays[3],
        floats={k: values[present.index(k)] if k in present else None for k in floats},
        blocked={k: bools[decided.index(k)] if k in decided else None for k in blocked},
    )
