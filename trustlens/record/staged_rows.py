"""The rows of a `record` call on accelerator tensors: checked on the device in one fused reduction
per input, read back once with the row count (the call's one host synchronisation: a bad value
raises from that call, naming the argument and the (b, t) index), then copied to pinned, reused
host buffers without waiting; the writer thread waits on a CUDA event and takes them as it takes a
CPU call's rows (trustlens.record.token_rows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from trustlens.record.routing import RouteEntries, RouteSnapshot
from trustlens.record.token_rows import (
    DIVERGENCE_INPUTS,
    LOGP_INPUTS,
    MASS_INPUTS,
    Buffers,
    TokenRows,
    check_rows,
    derive_rows,
    value_bounds,
)
from trustlens.rules import Rule
from trustlens.run.aggregates import Keep
from trustlens.run.parts import TokenBatch


@dataclass
class StagedRows:
    """A `record` call's rows from an accelerator, on their way to the host (`stage_rows`)."""

    rows: TokenRows  # the host copies, checked; mask, token_ids and values go back to rows.buffers once taken
    held: list[torch.Tensor]  # the other host copies (decisions, ids, advantages): back to rows.buffers then too
    device_rows: TokenRows  # the device snapshot copied from; back to its buffers once the copies are done
    ready: torch.cuda.Event | None  # recorded after the copies (CUDA); None: they are done already


def value_flags(names: list[str], values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(F,) bool on the values' device: input f of `values` (F, B, T) holds a value outside its
    `value_bounds` at a valid position (NaN included). One fused min/max reduction over every input,
    no host synchronisation; the padding is read as 0, an allowed value of every input."""
    if not values.numel():
        return torch.zeros(len(names), dtype=torch.bool, device=values.device)
    lo, hi = torch.aminmax(values.masked_fill(~mask, 0).reshape(len(names), -1), dim=1)  # (F,) each
    finite = torch.finfo(values.dtype).max
    return ~torch.stack(
        [(lo[f] >= low) & (hi[f] <= high) for f, (low, high) in enumerate(value_bounds(n, finite) for n in names)]
    )


def _clamp_rounding(names: list[str], values: torch.Tensor) -> None:
    """The clamps of `check_values` on checked `values` (F, B, T), in place and unconditional
    (no bound is read back): log-probabilities to ≤ 0, divergences to ≥ 0, topk_tv to ≤ 1."""
    for v, name in zip(values, names, strict=True):
        if name in LOGP_INPUTS:
            v.clamp_(max=0.0)
        elif name in DIVERGENCE_INPUTS:
            v.clamp_(min=0.0, max=1.0 if name in MASS_INPUTS else None)


def stage_rows(
    rows: TokenRows,  # on the accelerator, not checked: the snapshot `record` made
    flags: list[torch.Tensor],  # bool tensors on its device, True: another check of the call failed
    explain: list[Callable[[], object]],  # checks that raise, naming the bad value, for those flags
    host: Buffers,  # where the host copies come from (pinned)
) -> tuple[StagedRows, int]:
    """(the rows on their way to the host, the number of valid positions), with one host
    synchronisation: every check of the call (`flags`, the values' `value_flags`, the ids' int32
    range) reduced on the device to one flag, read back with the count. When it is set, the
    checks run again one by one (`explain`, then `check_rows`, host synchronisations on a bad
    input only) and raise the ValueError naming the argument and the (b, t) of the bad value:
    a bad accelerator input is refused by its own call. Otherwise the rounding is clamped on the
    device and the snapshot is copied into `host` buffers with non-blocking copies, which the
    writer thread waits for (`derive_staged`): `record` returns without waiting for them."""
    ids = rows.token_ids
    outside = ids < 0
    if torch.iinfo(ids.dtype).max >= 2**31:
        outside |= ids >= 2**31
    checks = [value_flags(rows.names, rows.values, rows.mask), (rows.mask & outside).reshape(-1)]
    bad = torch.cat([*checks, *(f.reshape(-1) for f in flags)]).any()
    counts = [rows.mask.count_nonzero(), bad.long()]
    if isinstance(rows.routes, RouteSnapshot):  # and the flipped (token, layer) pairs to copy
        counts.append(rows.routes.flipped.count_nonzero())
    n_rows, failed, *flipped = torch.stack(counts).tolist()  # the one host synchronisation
    if failed:
        try:
            for check in explain:
                check()
            check_rows(rows)
        finally:
            if rows.buffers is not None:
                rows.buffers.give_back(rows.mask, rows.token_ids, rows.values)
        raise ValueError("record: an input failed its check on the device but not on the host; please report this")
    _clamp_rounding(rows.names, rows.values)
    pin = rows.mask.device.type == "cuda"
    cpu = torch.device("cpu")

    def to_host(t: torch.Tensor) -> torch.Tensor:
        return host.empty(tuple(t.shape), t.dtype, cpu).copy_(t, non_blocking=pin)

    held: list[torch.Tensor] = []

    def held_copy(t: Any) -> Any:  # a tensor copied to the host and held; anything else as it is
        if not isinstance(t, torch.Tensor):
            return t
        held.append(to_host(t))
        return held[-1]

    samples = held_copy(rows.samples)
    routes = rows.routes
    if isinstance(routes, RouteSnapshot):  # only the flipped pairs leave the device
        routes = RouteEntries(*(held_copy(t) for t in routes.entries(flipped[0]).tensors()))
    host_rows = replace(
        rows,
        mask=to_host(rows.mask),
        token_ids=to_host(rows.token_ids),
        values=to_host(rows.values),
        samples=samples,
        groups=samples if rows.groups is rows.samples else held_copy(rows.groups),
        decided=held_copy(rows.decided),
        sequence_advantages=held_copy(rows.sequence_advantages),
        routes=routes,
        buffers=host,
        checked=True,
    )
    ready = None
    if pin:
        ready = torch.cuda.Event()
        ready.record()
    return StagedRows(rows=host_rows, held=held, device_rows=rows, ready=ready), n_rows


def derive_staged(
    step: int,
    update: int,
    staged: StagedRows,
    rules: list[Rule],
    evaluable: list[Rule],
    keep: Keep | None,
    rank: int,
    active: str | None = None,
) -> TokenBatch:
    """`derive_rows` of staged rows, in the writer thread: waits for their copies (the CUDA
    event), hands the device snapshot and the host copies back for reuse."""
    if staged.ready is not None:
        staged.ready.synchronize()
    device = staged.device_rows
    if device.buffers is not None:
        device.buffers.give_back(device.mask, device.token_ids, device.values)
    batch = derive_rows(step, update, staged.rows, rules, evaluable, keep, rank, active)
    if staged.rows.buffers is not None:
        staged.rows.buffers.give_back(*staged.held)
    return batch
