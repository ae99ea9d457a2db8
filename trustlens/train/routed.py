"""The trainer's side of a mixture-of-experts policy (`--model moe`): the forward that gives log π
and π's routing in one pass (with the engine's routing forced under `--routing-replay`, R3), the
router's load-balancing loss, the routing metrics of a step, and the shadow forward that splits
the mismatch into routing and residual parts (`--routing-split-every`).

Alignment: the record's (B, T, L, k) expert ids of response token a_t are the routing of the
position whose output predicts a_t (position P + t − 1, input token a_{t−1}, the prompt's last
token for t = 0): the routing that a flip there changes log π(a_t) through directly.

Metrics (means over the step's response tokens, pooled over ranks; Δ log p in nats):
- ``routing/flipped_tokens``: share of tokens with at least one MoE layer whose expert sets differ
  between the engine and the trainer's own routing; ``routing/flipped_layers``: share of
  (token, MoE layer) pairs that differ;
- with the shadow forward: ``routing/dlogp_routing`` and ``routing/dlogp_residual`` (signed means
  of live − replayed and replayed − log μ, at π_old), ``routing/abs_dlogp_routing`` and
  ``routing/abs_dlogp_residual`` (means of their absolute values), ``routing/share`` =
  Σ|routing| / (Σ|routing| + Σ|residual|), and ``routing/k3_live``, ``routing/k3_replayed`` (the
  K3 estimate ρ − 1 − log ρ of π_old vs μ under the trainer's own and under μ's routing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trustlens.divergence import token_logp
from trustlens.routing.replay import RoutingSplit, RoutingTrace, routers, routing, split_dlogp
from trustlens.train.pooled import Pooled, masked_mean, ratio
from trustlens.train.rollout import response_logits
from trustlens.train.rollout_batch import Rollout


@dataclass
class RoutedPass:
    """What a forward of a mixture of experts routed, beside its logits."""

    experts: torch.Tensor  # (B, T, L, k) long: the experts at the positions predicting a_t (−1 dense)
    aux_loss: torch.Tensor  # () the router's load-balancing loss of the pass (with its graph)


def policy_logits(
    model: torch.nn.Module, batch: Rollout, temperature: float, *, replay: bool = False
) -> tuple[torch.Tensor, RoutedPass | None]:
    """(logits / τ (B, T, V), the pass's routing or None for a dense model): one forward; with
    `replay` the engine's experts (batch.routed_experts) are forced (R3)."""
    if not routers(model):
        return response_logits(model, batch, temperature), None
    if replay and batch.routed_experts is None:
        raise ValueError("routing replay: the rollout carries no routed experts (the engine's model is dense)")
    with routing(model, force=batch.routed_experts if replay else None) as trace:
        logits = response_logits(model, batch, temperature)
    experts = response_routes(trace.routed_experts(len(batch)), batch.prompt_len)
    return logits, RoutedPass(experts, load_balancing_loss(trace, batch.attention_mask))


def response_routes(experts: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """(B, T, L, k) of a (B, P + T, L, k) sequence's experts: positions P − 1 … P + T − 2."""
    return experts[:, prompt_len - 1 : -1]


def load_balancing_loss(trace: RoutingTrace, attention_mask: torch.Tensor) -> torch.Tensor:
    """The Switch-Transformer load-balancing loss of one full forward, as transformers defines it
    for its MoE models: E · Σ_e f_e · P_e, f_e = top-k assignments to expert e per real token and
    P_e = mean router probability of e, both pooled over the MoE layers (padding left out); the
    assignments are the experts the pass used (the forced ones under replay)."""
    mask = attention_mask.reshape(-1).float()  # (B·S,)
    assigned = probs = None
    for layer, (logits,) in trace.logits.items():
        experts = trace.experts[layer][0]  # (B·S, k)
        p = torch.softmax(logits.float(), dim=-1)  # (B·S, E)
        counts = torch.zeros(p.shape[1]).scatter_add_(0, experts.reshape(-1), mask.repeat_interleave(trace.k))
        assigned = counts if assigned is None else assigned + counts
        probs = (p * mask[:, None]).sum(0) if probs is None else probs + (p * mask[:, None]).sum(0)
    if assigned is None or probs is None:
        raise ValueError("load_balancing_loss: the pass routed nothing")
    rows = mask.sum() * len(trace.logits)
    return probs.shape[0] * torch.sum((assigned / rows) * (probs / rows))


def flipped(mu_experts: torch.Tensor, pi_experts: torch.Tensor) -> torch.Tensor:
    """(B, T, L) bool: layers where the two (B, T, L, k) expert sets differ (never on dense layers)."""
    moe = (mu_experts >= 0).all(-1) & (pi_experts >= 0).all(-1)
    return moe & (mu_experts.sort(-1).values != pi_experts.sort(-1).values).any(-1)


def flip_metrics(mu_experts: torch.Tensor, pi_experts: torch.Tensor, mask: torch.Tensor) -> dict[str, Pooled]:
    """routing/flipped_tokens and routing/flipped_layers of the response tokens `mask` (B, T)."""
    flips = flipped(mu_experts, pi_experts)  # (B, T, L)
    moe_layers = ((mu_experts >= 0).all(-1) & mask[..., None]).any((0, 1))  # (L,) layers routed here
    pairs = flips[..., moe_layers]  # (B, T, L_moe)
    return {
        "routing/flipped_tokens": masked_mean(pairs.any(-1).double(), mask),
        "routing/flipped_layers": ratio(float(pairs[mask].sum()), float(mask.sum()) * int(moe_layers.sum())),
    }


@torch.no_grad()
def shadow_split(
    model: torch.nn.Module, batch: Rollout, temperature: float, old_logp: torch.Tensor, *, replay: bool
) -> tuple[RoutingSplit, torch.Tensor | None]:
    """The split of Δ log p = log π_old − log μ (trustlens.routing.replay.split_dlogp) from the
    step's π_old pass and one shadow forward at the same weights: the replayed pass when π_old used
    the trainer's own routing, the live pass under `replay` (π_old then used μ's). Returns the
    split and, under `replay`, the live pass's (B, T, L, k) experts (else None: π_old's are)."""
    logits, routed = policy_logits(model, batch, temperature, replay=not replay)
    if routed is None:
        raise ValueError("routing split: the model is dense; it needs a mixture of experts (--model moe)")
    shadow = token_logp(logits.float(), batch.response_ids)
    live, replayed = (shadow, old_logp) if replay else (old_logp, shadow)
    return split_dlogp(live, replayed, batch.mu_logp, batch.response_mask), routed.experts if replay else None


def split_metrics(split: RoutingSplit, mask: torch.Tensor) -> dict[str, Pooled]:
    """The routing/* metrics of the shadow forward (module docstring)."""
    routing_abs, residual_abs = split.routing.abs(), split.residual.abs()
    live_rho = split.routing + split.residual  # log π_old(live) − log μ
    return {
        "routing/dlogp_routing": masked_mean(split.routing, mask),
        "routing/dlogp_residual": masked_mean(split.residual, mask),
        "routing/abs_dlogp_routing": masked_mean(routing_abs, mask),
        "routing/abs_dlogp_residual": masked_mean(residual_abs, mask),
        "routing/share": ratio(float(routing_abs[mask].sum()), float((routing_abs + residual_abs)[mask].sum())),
        "routing/k3_live": masked_mean(live_rho.exp() - 1 - live_rho, mask),
        "routing/k3_replayed": masked_mean(split.residual.exp() - 1 - split.residual, mask),
    }


def routing_record_kwargs(mu_experts: torch.Tensor | None, pi_experts: torch.Tensor | None) -> dict:
    """The routing arguments of `TokenRecorder.record` for one update, `mu_routed_experts` and
    `pi_routed_experts` ((B, T, L, k) each, the experts of the position that predicts each
    response token), when the model is a mixture of experts; else none."""
    if mu_experts is None or pi_experts is None:
        return {}
    return {"mu_routed_experts": mu_experts, "pi_routed_experts": pi_experts}


__all__ = [
    "RoutedPass",
    "flip_metrics",
    "flipped",
    "load_balancing_loss",
    "policy_logits",
    "response_routes",
    "routing_record_kwargs",
    "shadow_split",
    "split_metrics",
]
