"""The rows of one `TokenRecorder.record` call: copied in the caller's thread, then checked, taken
at the valid positions and derived where the rows are made (the writer thread for CPU tensors).

The caller pays for one copy of its per-token inputs: the float inputs are stacked into one
(F, B, T) tensor and the token ids copied (the snapshot the rows are later taken from, so the
caller may reuse its tensors as soon as `record` returns; the tensors themselves are reused
across calls, see `Buffers`). `check_rows` checks the snapshot: one min and one max per input
over every position decide whether all values are allowed; only when they are not (bad input, or
a padding holding NaN, ±inf or out-of-range values) are the inputs checked one by one at the
valid positions, which names the argument and the (b, t) index of the first bad value. For CPU
tensors the check, selecting the valid positions (nonzero, gathers), deciding the rules and
deriving the columns happen in `derive_rows`, in the writer thread: with the writer busy on the
other core, the caller's share of benchmarks/recorder.py fell from 4.85–5.88% to 3.89–4.56% of
the raw write when the checks left the caller (4 alternating pairs of runs, each the median of 5
rounds, idle 2-core machine). A bad CPU input is
then found after its call returned: its rows are dropped and the next call raises
`RejectedInputError`. Accelerator tensors are checked on the device and read back once, with the
row count, in the call: a bad value raises from that call; clean rows leave the device in non-blocking
copies to pinned host buffers, which the writer thread waits for (a CUDA event) before taking
them as it takes a CPU call's (trustlens.record.staged_rows).
"""

from __future__ import annotations

import functools
import math
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import torch

from trustlens.core import logspace
from trustlens.core.tensor_checks import (
    LOGP_TOLERANCE,
    _first_index,
    check_logp,
    check_nonnegative,
    check_tensor,
    check_tv,
)
from trustlens.record.routing import RouteEntries, RouteSnapshot
from trustlens.record.sequence_stats import sequence_statistics
from trustlens.rules import Rule
from trustlens.rules.columns import decide_columns
from trustlens.run.aggregates import Keep, keep_rows
from trustlens.run.errors import RejectedInputError
from trustlens.run.parts import TokenBatch
from trustlens.run.routes import ROUTE_SCALARS

LOGP_INPUTS = ("pi_logp", "mu_logp", "old_logp", "pi_logp_raw")
# the inputs that are ≥ 0: divergences, masses and the engine's per-token counts
DIVERGENCE_INPUTS = (
    "entropy",
    "topk_tv",
    "topk_kl",
    "mu_topk_mass",
    "pi_topk_mass",
    "support_size",
    "pi_support_mass",
    "staleness",
    "seq_weight",
)
MASS_INPUTS = ("topk_tv", "mu_topk_mass", "pi_topk_mass", "pi_support_mass")  # probability masses: in [0, 1]
ENGINE_INPUTS = ("support_size", "pi_support_mass", "staleness")  # from the engine's mask and weight versions
TRAINER_INPUTS = ("seq_weight",)  # what the trainer applied: its sequence importance weight
# columns only record's logit pass derives (trustlens.record.logit_quantities): null without logits
_LOGIT_COLUMNS = ("pi_logp_raw", "mu_topk_mass", "pi_topk_mass")


def value_bounds(name: str, finite: float) -> tuple[float, float]:
    """The lowest and highest value input `name` may hold (`finite`: the largest finite value of
    its dtype): log-probabilities ≤ LOGP_TOLERANCE (−inf is probability 0), finite advantages, and
    divergences ≥ −LOGP_TOLERANCE and finite, +inf allowed for topk_kl (π = 0 < μ), topk_tv and
    the top-K masses ≤ 1 + LOGP_TOLERANCE."""
    if name in LOGP_INPUTS:
        return -math.inf, LOGP_TOLERANCE
    if name == "advantages":
        return -finite, finite
    if name in MASS_INPUTS:
        return -LOGP_TOLERANCE, 1 + LOGP_TOLERANCE
    if name in ROUTE_SCALARS:  # derived by the recorder (trustlens.record.routing); −1: none
        return -1.0, finite
    return -LOGP_TOLERANCE, math.inf if name == "topk_kl" else finite


def _allowed(name: str, lo: float, hi: float) -> bool:
    """Whether an input whose values span [lo, hi] holds only allowed values (`value_bounds`; NaN
    fails every test)."""
    low, high = value_bounds(name, sys.float_info.max)
    return lo >= low and hi <= high


# the check of each input one by one, naming the argument and the index of a bad value
_CHECKS: dict[str, Callable[..., torch.Tensor]] = {
    "advantages": check_tensor,
    "entropy": check_nonnegative,
    "topk_tv": check_tv,
    "topk_kl": functools.partial(check_nonnegative, allow_inf=True),
    "mu_topk_mass": check_tv,  # a probability mass: in [0, 1] as a TV is
    "pi_topk_mass": check_tv,
    "support_size": check_nonnegative,
    "pi_support_mass": check_tv,
    "staleness": check_nonnegative,
    **dict.fromkeys(ROUTE_SCALARS, lambda name, t: t),  # derived by the recorder from checked ids
    "seq_weight": check_nonnegative,
}


class Buffers:
    """Tensors for the copies `record` makes, reused once the writer has taken their rows.

    A fresh (F, B, T) snapshot per call costs the caller its page faults as well as the copy:
    in benchmarks/recorder.py (64 × 1024 calls, four float inputs) the caller's time in `record`
    fell from 7.2–7.6% to 5.4–5.7% of the raw write when the copies were reused (two runs each,
    2026-11-26). At most `keep` free tensors of each shape, dtype and device are kept. `pin`:
    CPU tensors are allocated in pinned memory where CUDA is available (the host side of
    non-blocking copies from the GPU; pinning is slow, hence the reuse)."""

    def __init__(self, keep: int = 4, *, pin: bool = False) -> None:
        self.keep = keep
        self.pin = pin
        self._free: dict[tuple, list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A tensor of `shape`, `dtype` on `device` with undefined values: a free one, else new."""
        with self._lock:
            free = self._free.get((tuple(shape), dtype, device))
            if free:
                return free.pop()
        pin = self.pin and device.type == "cpu" and torch.cuda.is_available()
        return torch.empty(shape, dtype=dtype, device=device, pin_memory=pin)

    def give_back(self, *tensors: torch.Tensor) -> None:
        """Hand tensors from `empty` back for reuse: nothing may read or write them afterwards."""
        with self._lock:
            for t in tensors:
                free = self._free.setdefault((tuple(t.shape), t.dtype, t.device), [])
                if len(free) < self.keep:
                    free.append(t)


NO_REUSE = Buffers(keep=0)  # a fresh tensor for every copy


@dataclass
class TokenRows:
    """One `record` call's checked inputs, copied: nothing here aliases the caller's tensors."""

    mask: torch.Tensor  # (B, T) bool: the valid positions
    token_ids: torch.Tensor  # (B, T) the caller's integer dtype
    samples: torch.Tensor | int  # (B,) int64 sample ids, or the first of B consecutive ones
    groups: torch.Tensor | int  # (B,) int64 group ids, or the first of B consecutive ones
    names: list[str]  # the per-token inputs in `values`: LOGP_INPUTS, DIVERGENCE_INPUTS, "advantages"
    values: torch.Tensor  # (F, B, T) float32 (float64 when an input is): those inputs
    decided_rules: list[str]  # the rules the caller decided itself
    decided: torch.Tensor | None  # (R, B, T) bool: their decisions, in that order (None: no rule)
    sequence_advantages: torch.Tensor | None  # (B,) per-sequence advantages; None: "advantages" in `values`
    buffers: Buffers | None = None  # where mask, token_ids and values go back once their rows are taken
    checked: bool = True  # False: values and token_ids not checked yet (`check_rows`, in the writer thread)
    routes: RouteSnapshot | RouteEntries | None = None  # the routing of a call given routed experts


def snapshot_values(
    columns: Mapping[str, torch.Tensor], mask: torch.Tensor, buffers: Buffers = NO_REUSE
) -> torch.Tensor:
    """The per-token inputs `columns` {name: (B, T) float} stacked into one (F, B, T) copy on the
    mask's device, float32 (float64 when one is), in a tensor from `buffers`; the padding copied
    as it is (the rows are taken at the valid positions only). Not checked: `check_values`."""
    dtype = torch.float64 if any(t.dtype == torch.float64 for t in columns.values()) else torch.float32
    values = buffers.empty((len(columns), *mask.shape), dtype, mask.device)
    given = [
        t.detach() if (t.device, t.dtype) == (mask.device, dtype) else t.detach().to(mask.device, dtype)
        for t in columns.values()
    ]
    if values.numel():
        torch.stack(given, out=values)  # (F, B, T)
    return values


def check_values(names: list[str], values: torch.Tensor, mask: torch.Tensor) -> None:
    """Check the snapshot `values` (F, B, T) of the inputs `names` in place: log-probabilities in
    (0, LOGP_TOLERANCE] are clamped to 0 and divergences in [−LOGP_TOLERANCE, 0) to 0. Raises
    ValueError naming the argument and the (b, t) index of the first value not allowed at a valid
    position.

    One min and one max per input over every position decide whether all values are allowed; only
    when one is not (bad input, or a padding holding NaN, ±inf or out-of-range values) are the
    inputs checked one by one at their valid positions."""
    if not values.numel():
        return
    bounds = torch.stack([torch.stack(torch.aminmax(v)) for v in values]).tolist()  # (F, 2), one sync
    if not all(_allowed(name, lo, hi) for name, (lo, hi) in zip(names, bounds, strict=True)):
        for name, v in zip(names, values, strict=True):  # raises at the first bad value at a valid position
            _CHECKS.get(name, check_logp)(name, v.masked_fill(~mask, 0))
    for v, name, (lo, hi) in zip(values, names, bounds, strict=True):
        if name in LOGP_INPUTS and not hi <= 0:
            v.clamp_(max=0.0)
        elif name in DIVERGENCE_INPUTS and not lo >= 0:
            v.clamp_(min=0.0)
        if name in MASS_INPUTS and hi > 1:
            v.clamp_(max=1.0)


def snapshot_token_ids(token_ids: torch.Tensor, mask: torch.Tensor, buffers: Buffers = NO_REUSE) -> torch.Tensor:
    """`token_ids` (B, T) copied on the mask's device in their own integer dtype, in a tensor from
    `buffers`. Not checked: `check_token_range(ids, mask, 2**31)` (the run stores int32 ids)."""
    ids = token_ids.detach()
    return buffers.empty(tuple(ids.shape), ids.dtype, mask.device).copy_(ids)


def check_rows(rows: TokenRows) -> None:
    """`check_values` and the int32 range of the token ids of a `record` call's snapshot."""
    check_values(rows.names, rows.values, rows.mask)
    check_token_range(rows.token_ids, rows.mask, 2**31)


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


def derive_rows(
    step: int,
    update: int,
    rows: TokenRows,
    rules: list[Rule],
    evaluable: list[Rule],
    keep: Keep | None,
    rank: int,
    active: str | None = None,
) -> TokenBatch:
    """The TokenBatch of `rows`: `take_rows` then `finish_rows` (both in the writer thread for
    CPU tensors; for accelerator tensors `record` takes the rows itself, so that only compact
    rows leave the device, and the writer thread finishes them). `active`: the run's active rule
    (`keep_rows`)."""
    if not rows.checked:
        try:
            check_rows(rows)
        except ValueError as err:
            if rows.buffers is not None:
                rows.buffers.give_back(rows.mask, rows.token_ids, rows.values)
            raise RejectedInputError(
                f"record(step={step}, update={update}) was not recorded: {err} (found by the writer "
                "thread after that call returned)"
            ) from None
    return finish_rows(take_rows(step, update, rows, rules), rules, evaluable, keep, rank, active)


@torch.no_grad()
def take_rows(step: int, update: int, rows: TokenRows, rules: list[Rule]) -> TokenBatch:
    """One row per valid position (N) of `rows`: its ids, its float inputs (in the dtype of
    `rows.values`, float32 or float64; advantages under the run's column name "advantage") and
    the caller's decisions (None for every other rule), moved to the CPU as numpy arrays."""
    b, t = torch.nonzero(rows.mask, as_tuple=True)  # (N,) each
    index = b * rows.mask.shape[1] + t  # (N,) flat positions
    taken = rows.values.reshape(len(rows.names), -1).index_select(1, index)  # (F, N)
    values = dict(zip(rows.names, taken.unbind(0), strict=True))
    if rows.sequence_advantages is not None:
        values["advantages"] = rows.sequence_advantages.index_select(0, b).to(taken.dtype)
    decisions = {}
    if rows.decided is not None:
        taken_decisions = rows.decided.reshape(len(rows.decided_rules), -1).index_select(1, index)  # (R, N)
        decisions = dict(zip(rows.decided_rules, taken_decisions.unbind(0), strict=True))
    ints = [
        *(
            b + per_row if isinstance(per_row, int) else per_row.index_select(0, b)
            for per_row in (rows.samples, rows.groups)
        ),
        t,
        rows.token_ids.reshape(-1)[index].long(),
    ]
    names = (
        *("mu_logp", "old_logp", "pi_logp", "topk_tv", "topk_kl", "entropy"),
        *(*_LOGIT_COLUMNS, *ENGINE_INPUTS, *TRAINER_INPUTS),
    )
    floats = {**{k: values.get(k) for k in (*names, *ROUTE_SCALARS)}, "advantage": values["advantages"]}
    batch = _to_cpu(step, update, ints, floats, {r.name: decisions.get(r.name) for r in rules})
    if rows.routes is not None:  # the expert sets of the rows' flipped layers, and the per-layer counts
        entries = rows.routes.entries() if isinstance(rows.routes, RouteSnapshot) else rows.routes
        lists, counts = entries.lists(index)
        batch = replace(batch, routes=lists, routing=counts)
    if rows.buffers is not None:  # every row is taken (copied) from them now
        rows.buffers.give_back(rows.mask, rows.token_ids, rows.values)
    return batch


def finish_rows(
    batch: TokenBatch, rules: list[Rule], evaluable: list[Rule], keep: Keep | None, rank: int, active: str | None = None
) -> TokenBatch:
    """`batch` (from `take_rows`) as the run stores it, with numpy: the decision of every
    evaluable rule the caller did not decide (`trustlens.rules.columns.decide_columns`, in the inputs' dtype; a
    μ-anchored rule anchors on π_old when μ is not given), the ratio π/anchor and binary TV and
    KL derived from the float32 log-probs (`logspace.derived_columns`, as the reader derives
    them for sampled runs), every float column float32, and each response's statistics
    (`sequence_statistics`, which the sequence rules read, so that they are decided again exactly
    on a sampled run's kept rows); sampled under `keep` when given (`keep_rows`, `active` the
    run's active rule).

    numpy rather than torch: in the writer thread, numpy's work holds the GIL once per call
    where each of ~50 small torch ops would hand it over (and a Python-bound training loop would
    wait for it back), and it is faster at this size: the 8 rules of benchmarks/recorder.py on
    49,000 float32 rows took 4.4 ms with torch (TokenInputs) and 2.0 ms with numpy, before
    sharing the stored binary TV and KL (measured on one thread, 2026-11-26)."""
    f = batch.floats
    anchor = "mu_logp" if f["mu_logp"] is not None else "old_logp"
    pi, anchor_logp = f["pi_logp"], f[anchor]
    assert pi is not None and anchor_logp is not None  # record requires them
    derived = logspace.derived_columns(pi, anchor_logp)
    # the stored binary TV and KL are the distances of the rules anchored there (same function,
    # same float32 inputs); float64 inputs are decided in float64
    shared = pi.dtype == np.float32
    distances = {(k, anchor, "pi"): derived[k] for k in ("binary_tv", "binary_kl")} if shared else {}
    eps = float(np.finfo(pi.dtype).eps)
    pending = [r for r in evaluable if batch.blocked.get(r.name) is None]
    stats = sequence_statistics(batch.sample, pi, anchor_logp, f["old_logp"])  # float64 / int32, as stored
    given = {k: v for k, v in {**f, **stats}.items() if v is not None}  # the rules read only given columns
    seed = (batch.step, batch.update)  # a batch rule decides over all the call's rows, before sampling
    decided = {r.name: decide_columns(r, given.__getitem__, anchor, distances, eps, seed) for r in pending}
    floats = {k: None if v is None else v.astype(np.float32, copy=False) for k, v in f.items()}
    batch = replace(batch, floats={**floats, **derived, **stats}, blocked={**batch.blocked, **decided})
    return keep_rows(batch, keep, [r.name for r in rules], rank, active)


def _to_cpu(step: int, update: int, ints: list[torch.Tensor], floats: dict, blocked: dict) -> TokenBatch:
    """The rows as CPU numpy arrays. Every tensor here was made by `record` or `derive_rows` (none
    aliases the caller's), so on the CPU they are handed over without a copy; from another device
    they move in three transfers: ints (sample, group, pos, token_id), floats (one dtype: they
    were taken from one snapshot), rule decisions."""
    present = [k for k, v in floats.items() if v is not None]
    decided = [k for k, v in blocked.items() if v is not None]
    columns = [ints, [floats[k] for k in present], [blocked[k] for k in decided]]
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
