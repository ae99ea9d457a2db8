"""One `TokenRecorder.record` call's inputs: checked where no pass over the data is needed (types,
shapes, devices: `checked_inputs`, a ValueError naming the argument), then copied into the call's
snapshot with the checks left to the values (`snapshot_call`): flags on the tensors' device,
which the recorder reads in its one host synchronisation (trustlens.record.staged_rows) or, for
CPU tensors, at once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from trustlens.core.tensor_checks import check_same_device, check_tensor
from trustlens.record.args import check_arguments, checked_advantages
from trustlens.record.logit_quantities import pending_logit_quantities
from trustlens.record.routing import check_routing, derive_routing
from trustlens.record.token_rows import Buffers, TokenRows, snapshot_values


@dataclass
class CallInputs:
    """A `record` call's tensors, checked for type, shape and device."""

    shape: tuple[int, int]  # (B, T) of token_ids
    per_token: dict[str, torch.Tensor | None]  # the (B, T) float inputs by name (None: not given)
    advantages: torch.Tensor  # (B,) per sequence or (B, T) per token
    logits: torch.Tensor | None  # (B, T, V) π's logits
    mu_topk_ids: torch.Tensor | None  # (B, T, K) μ's top-K ids
    mu_topk_logp: torch.Tensor | None  # (B, T, K) their log μ
    temperature: float  # the sampling temperature the logits are divided by
    routing: tuple[torch.Tensor, torch.Tensor, int] | None  # (μ's, π's (B, T, L, k) experts, id bound)


def checked_inputs(
    *,
    token_ids: object,
    response_mask: object,
    advantages: object,
    logits: torch.Tensor | None,
    mu_topk_ids: torch.Tensor | None,
    mu_topk_logp: torch.Tensor | None,
    temperature: float,
    per_token: dict[str, torch.Tensor | None],
    routed: tuple[object, object, object],  # (mu_routed_experts, pi_routed_experts, num_experts)
) -> CallInputs:
    """The checks of `record`'s tensors that need no pass over the data; raises ValueError
    naming the argument and records nothing."""
    check_same_device(
        token_ids=token_ids,
        response_mask=response_mask,
        advantages=advantages,
        logits=logits,
        mu_topk_ids=mu_topk_ids,
        mu_topk_logp=mu_topk_logp,
        mu_routed_experts=routed[0],
        pi_routed_experts=routed[1],
        **per_token,
    )
    shape = check_arguments(token_ids, per_token, mu_topk_ids, mu_topk_logp, temperature)
    if (per_token["topk_tv"] is None) != (per_token["topk_kl"] is None):
        raise ValueError("topk_tv and topk_kl must be given together")
    if mu_topk_ids is not None and logits is None and per_token["topk_tv"] is None:
        raise ValueError(
            "mu_topk_ids and mu_topk_logp were given without logits: the top-K TV and KL also need "
            "π's logits (logits=, (B, T, V)), or pass them precomputed as topk_tv and topk_kl"
        )
    return CallInputs(
        shape=shape,
        per_token=per_token,
        advantages=checked_advantages(advantages, shape),
        logits=logits,
        mu_topk_ids=mu_topk_ids,
        mu_topk_logp=mu_topk_logp,
        temperature=temperature,
        routing=check_routing(*routed[:2], shape, routed[2]),
    )


@dataclass
class CallSnapshot:
    """A call's snapshot and the checks of its values still to be read."""

    rows: TokenRows  # the copies, values not checked yet
    flags: list[torch.Tensor]  # bool tensors on the device, True: a check failed
    explain: list[Callable[[], object]]  # the checks that raise naming the bad value, for those flags
    columns: tuple[str, ...]  # the per-token columns the call fills (which rules it can decide)


def snapshot_call(
    inputs: CallInputs,
    *,
    mask: torch.Tensor,  # (B, T) bool, the recorder's copy of response_mask
    token_ids: torch.Tensor,  # (B, T) the recorder's copy of the ids
    samples: torch.Tensor | int,  # (B,) sample ids or the first of B consecutive ones
    groups: torch.Tensor | int,  # the same for group ids
    decided: Mapping[str, torch.Tensor],  # rule -> (B, T) bool decisions the caller made
    buffers: Buffers,  # where the copies come from
    staged: bool,  # the values are checked on the device (an accelerator's call)
) -> CallSnapshot:
    """The call's copies: the per-token inputs with what π's logits give (entropy, top-K) and the
    routing's columns stacked into one (F, B, T) snapshot, on the mask's device."""
    device = mask.device
    columns = {k: v for k, v in inputs.per_token.items() if v is not None}
    flags: list[torch.Tensor] = []
    explain: list[Callable[[], object]] = []
    per_sequence = None  # (B,) advantages per sequence, checked and copied (not per token: no (B, T) copy)
    if inputs.advantages.dim() == 2:
        columns["advantages"] = inputs.advantages
    else:
        per_sequence = inputs.advantages.detach().to(device, copy=True)
        if staged:
            flags.append(~torch.isfinite(per_sequence).all())
            explain.append(functools.partial(check_tensor, "advantages", per_sequence))
        else:
            check_tensor("advantages", per_sequence)
    if inputs.logits is not None:
        given_topk = inputs.per_token["topk_tv"] is not None
        pending = pending_logit_quantities(
            inputs.logits,
            mask,
            token_ids,
            None if given_topk else inputs.mu_topk_ids,
            None if given_topk else inputs.mu_topk_logp,
            inputs.per_token["mu_logp"],
            inputs.temperature,
            want_entropy=inputs.per_token["entropy"] is None,
        )
        if pending.bad is not None:
            flags.append(pending.bad)
            explain.append(pending.explain)
        columns.update(pending.columns)
    routes = None
    if inputs.routing is not None:
        route_columns, routes, bad, check = derive_routing(*inputs.routing[:2], mask, inputs.routing[2])
        flags.append(bad)
        explain.append(check)
        columns.update(route_columns)
    rows = TokenRows(
        mask=mask,
        token_ids=token_ids,
        samples=samples,
        groups=groups,
        names=list(columns),
        values=snapshot_values(columns, mask, buffers),
        sequence_advantages=per_sequence,
        decided_rules=list(decided),
        decided=torch.stack([d.to(device) for d in decided.values()]) if decided else None,
        buffers=buffers,
        checked=False,
        routes=routes,
    )
    return CallSnapshot(rows, flags, explain, tuple(columns))
