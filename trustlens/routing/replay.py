"""Routing replay of mixture-of-experts models: read the experts a forward pass routes each token
to, force given experts (the engine's) in their place, and split a token's log-probability gap
into the part routing explains and the rest (`replay_split`).

A router here is a module of a Hugging Face MoE model (transformers 5.x: Qwen2-MoE, Qwen3-MoE,
Mixtral, OLMoE) whose class name ends in ``TopKRouter``: called on the (N, H) hidden states of a
decoder layer, it returns ``(router_logits (N, E), weights (N, k), experts (N, k))``, the weights
being softmax(router_logits) at the k chosen experts, renormalised over them when the router's
``norm_topk_prob`` is true (Mixtral always renormalises). `routing` hooks every router of a model:

- it keeps each call's chosen experts (and router logits), so that the pass that computes log π
  also gives π's routing, with no second pass;
- with ``force``, it replaces the chosen experts by the given ones (−1 keeps the router's own
  choice for that token) and recomputes the weights from the model's own router logits at those
  experts: routing replay (R3), through which the router still gets gradients;
- with ``router_dtype``, it rounds the router logits to that dtype before the top-k, as an engine
  that runs its router in reduced precision does (near-tied experts then flip).

Expert tensors are (B, S, L, k) int64: batch, sequence position, decoder layer, rank in the
top-k; −1 on dense layers (and where a position was never routed).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from trustlens.divergence import token_logp

DENSE = -1  # the expert id of a dense layer (or of a position not routed)
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # the decoder layer index in a module's name


def routers(model: torch.nn.Module) -> dict[int, Any]:
    """The model's top-k routers (torch modules with `top_k` and `num_experts`) by decoder layer
    index (empty for a dense model)."""
    found: dict[int, Any] = {}
    for name, module in model.named_modules():
        match = _LAYER.search(name + ".")
        if type(module).__name__.endswith("TopKRouter") and match:
            found[int(match.group(1))] = module
    return found


def num_layers(model: torch.nn.Module) -> int:
    """Decoder layers of a transformers causal LM (its config's num_hidden_layers)."""
    config: Any = model.config
    return int(config.num_hidden_layers)


def top_k(model: torch.nn.Module) -> int:
    """k of the model's routers (ValueError on a dense model, naming the fix)."""
    found = routers(model)
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no mixture-of-experts router (no *TopKRouter module): routing replay "
            "needs an MoE model (e.g. `--model moe`)"
        )
    return int(next(iter(found.values())).top_k)


def select_experts(
    router: Any, logits: torch.Tensor, experts: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (N, k), experts (N, k)) as `router` computes them from its logits (N, E): the
    top-k of softmax(logits) unless `experts` are given, the softmax at them, renormalised over
    the k when the router does; the weights in the dtype of `logits`."""
    probs = torch.softmax(logits.float(), dim=-1)  # (N, E)
    if experts is None:
        experts = probs.topk(router.top_k, dim=-1).indices
    weights = probs.gather(-1, experts)
    if getattr(router, "norm_topk_prob", True):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), experts


@dataclass
class RoutingTrace:
    """What the routers did during the passes of a `routing` block, call by call."""

    layers: int  # L: decoder layers of the model
    k: int  # experts per token
    experts: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # layer -> (N, k) per call
    logits: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # layer -> (N, E) per call

    def routed_experts(self, batch: int) -> torch.Tensor:
        """(B, S, L, k) int64: the experts of every call, concatenated along the sequence (a
        call of N rows covers N / B positions of each row, rows in order); −1 on dense layers."""
        if not self.experts:
            raise ValueError("routing: no router was called inside the block")
        per_layer = {
            layer: torch.cat([e.reshape(batch, -1, self.k) for e in calls], dim=1)
            for layer, calls in self.experts.items()
        }  # layer -> (B, S, k)
        seq = next(iter(per_layer.values())).shape[1]
        out = torch.full((batch, seq, self.layers, self.k), DENSE, dtype=torch.long)
        for layer, experts in per_layer.items():
            out[:, :, layer] = experts
        return out


@contextmanager
def routing(
    model: torch.nn.Module,
    *,
    force: torch.Tensor | None = None,  # (B, S, L, k) experts to use; −1 keeps the router's choice
    router_dtype: torch.dtype | None = None,  # round the router logits to this before the top-k
) -> Iterator[RoutingTrace]:
    """Hook the model's routers for the block (see the module docstring); yields the trace.

    With `force`, each router must be called once, on all B·S positions (a full forward without a
    cache); a token whose forced row holds an id outside [0, E) other than −1 raises ValueError.
    """
    found = routers(model)
    trace = RoutingTrace(layers=num_layers(model), k=top_k(model))
    if force is not None:
        _check_force(force, trace, found)

    def hook(layer: int):
        def rewrite(router: torch.nn.Module, args: tuple, output: tuple) -> tuple:
            logits, weights, experts = output
            if router_dtype is not None:
                logits = logits.to(router_dtype).to(logits.dtype)
                weights, experts = select_experts(router, logits)
            if force is not None:
                forced = force[:, :, layer].reshape(-1, trace.k).to(experts.device)  # (B·S, k)
                if forced.shape[0] != experts.shape[0]:
                    raise ValueError(
                        f"routing: force covers {forced.shape[0]} positions but layer {layer}'s router got "
                        f"{experts.shape[0]}: force needs one full forward over the (B, S) it was given"
                    )
                chosen = torch.where((forced >= 0).all(-1, keepdim=True), forced, experts)
                weights, experts = select_experts(router, logits, chosen)
            trace.experts.setdefault(layer, []).append(experts.detach())
            trace.logits.setdefault(layer, []).append(logits)
            return logits, weights, experts

        return rewrite

    handles = [router.register_forward_hook(hook(layer)) for layer, router in found.items()]
    try:
        yield trace
    finally:
        for handle in handles:
            handle.remove()


def _check_force(force: torch.Tensor, trace: RoutingTrace, found: dict[int, Any]) -> None:
    if force.dim() != 4 or force.shape[2:] != (trace.layers, trace.k):
        raise ValueError(
            f"routing: force must be (B, S, L={trace.layers}, k={trace.k}) expert ids, got {tuple(force.shape)}"
        )
    if force.dtype.is_floating_point or force.dtype == torch.bool:
        raise ValueError(f"routing: force must hold integer expert ids, got {force.dtype}")
    experts = int(next(iter(found.values())).num_experts)
    bad = (force < DENSE) | (force >= experts)
    if bool(bad.any()):
        b, s, layer, _ = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"routing: force holds expert id {int(force[b, s, layer].min())} at (b={b}, s={s}, layer={layer}); "
            f"ids must be in [0, {experts}) or −1"
        )


@dataclass
class RoutingSplit:
    """Each response token's Δ log p = log π − log μ, split at the replayed pass (float64, 0 off
    the response mask; the parts sum to Δ exactly, differences of float32 values being exact in
    float64)."""

    logp_live: torch.Tensor  # (B, T) log π(a_t) with the model's own routing
    logp_replayed: torch.Tensor  # (B, T) log π(a_t) with μ's routing forced
    routing: torch.Tensor  # (B, T) live − replayed: the part of Δ log p that routing explains
    residual: torch.Tensor  # (B, T) replayed − log μ: the rest (precision, staleness, bugs)
    pi_routed_experts: torch.Tensor | None = None  # (B, S, L, k) the live pass's experts


def split_dlogp(
    logp_live: torch.Tensor, logp_replayed: torch.Tensor, logp_mu: torch.Tensor, response_mask: torch.Tensor
) -> RoutingSplit:
    """The split of `RoutingSplit` from the two passes' log-probs and log μ, all (B, T)."""
    mask = response_mask.bool()
    live, replayed, mu = (torch.where(mask, x.detach().double(), 0.0) for x in (logp_live, logp_replayed, logp_mu))
    return RoutingSplit(logp_live=live, logp_replayed=replayed, routing=live - replayed, residual=replayed - mu)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: 0 at each row's first real token. (B, S) long."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def last_logits(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int, temperature: float
) -> torch.Tensor:
    """(B, T, V) the logits / τ that predict the last T = `response_len` tokens of `input_ids`
    (B, S): one forward without a cache, positions counted from each row's first real token."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
        use_cache=False,
    )
    return out.logits[:, -response_len - 1 : -1] / temperature


@torch.no_grad()
def replay_split(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # (B, S) prompt then response; the response is the last T positions
    attention_mask: torch.Tensor,  # (B, S) 1 on real tokens
    response_mask: torch.Tensor,  # (B, T) True on the response tokens to split
    mu_routed_experts: torch.Tensor,  # (B, S, L, k) the engine's experts at every position, −1 = none
    logp_mu: torch.Tensor,  # (B, T) log μ(a_t), the engine's
    *,
    temperature: float = 1.0,  # the sampling temperature: log-probs of logits / τ
) -> RoutingSplit:
    """Two forwards of `model` (a transformers MoE causal LM with *TopKRouter routers): one with its
    own routing (live), one with μ's routing forced (replay, `routing(force=...)`); returns each
    response token's split of Δ log p = log π − log μ into routing (live − replayed) and residual
    (replayed − log μ), in nats. A dense model raises ValueError."""
    top_k(model)  # a dense model fails here, with the fix named
    if response_mask.dim() != 2 or response_mask.shape[0] != input_ids.shape[0]:
        raise ValueError(f"replay_split: response_mask must be (B, T), got {tuple(response_mask.shape)}")
    if mu_routed_experts.shape[:2] != input_ids.shape:
        raise ValueError(
            f"replay_split: mu_routed_experts must be (B, S, L, k) with (B, S) = {tuple(input_ids.shape)}, "
            f"got {tuple(mu_routed_experts.shape)}"
        )
    T = response_mask.shape[1]
    ids = input_ids[:, -T:]  # (B, T) the response tokens
    with routing(model) as live_trace:
        live = token_logp(last_logits(model, input_ids, attention_mask, T, temperature).float(), ids)
    with routing(model, force=mu_routed_experts):
        replayed = token_logp(last_logits(model, input_ids, attention_mask, T, temperature).float(), ids)
    split = split_dlogp(live, replayed, logp_mu, response_mask)
    split.pi_routed_experts = live_trace.routed_experts(input_ids.shape[0])
    return split


__all__ = [
    "DENSE",
    "RoutingSplit",
    "RoutingTrace",
    "last_logits",
    "position_ids",
    "replay_split",
    "routers",
    "routing",
    "select_experts",
    "split_dlogp",
    "top_k",
]
