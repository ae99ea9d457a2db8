"""The routing of a `record` call on a mixture-of-experts model: the checks of `mu_routed_experts`
and `pi_routed_experts` and what the run keeps of them (trustlens.run.routes), derived on the
tensors' device without a host synchronisation.

For each valid token and layer l the sets S_μ (the rollout engine's k experts) and S_π (the
trainer's, from the forward that gives log π) are compared as sets: the layer is dense when every
id is −1 on both sides, else an MoE layer, flipped when S_μ ≠ S_π. Per token:
    route_flips       Σ_l 1{flipped}
    route_first_flip  min{l: flipped} (−1: none, stored as null)
    route_overlap     mean over MoE layers of |S_μ ∩ S_π| / k (−1: no MoE layer, stored as null)
and per layer over the call's valid tokens: MoE tokens, flipped tokens, Σ |S_μ ∩ S_π|.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from trustlens.core.tensor_checks import _first_index
from trustlens.run.routes import RouteLists

# expert ids are stored as int16: a model's experts must be numbered below this
EXPERT_BOUND = 2**15
ARGS = ("mu_routed_experts", "pi_routed_experts")


@dataclass
class RouteSnapshot:
    """A call's routing derived on the device: the rows' flipped layers and their expert sets."""

    flipped: torch.Tensor  # (B, T, L) bool: valid positions whose MoE layer l is flipped
    mu: torch.Tensor  # (B, T, L, k) int16 S_μ, sorted
    pi: torch.Tensor  # (B, T, L, k) int16 S_π, sorted
    counts: torch.Tensor  # (3, L) int64 per layer: MoE tokens, flipped tokens, Σ |S_μ ∩ S_π|

    def entries(self, m: int | None = None) -> RouteEntries:
        """The `m` flipped (token, layer) pairs (None: counted here, a host synchronisation on an
        accelerator) with their sets, on the snapshot's device."""
        layers, k = self.mu.shape[2:]
        flat = self.flipped.reshape(-1)
        m = int(flat.count_nonzero()) if m is None else m
        at = torch.nonzero_static(flat, size=m)[:, 0]  # (M,) flat (b, t, l), ascending
        return RouteEntries(
            token=at // layers,
            layer=(at % layers).to(torch.int16),
            mu=self.mu.reshape(-1, k).index_select(0, at),
            pi=self.pi.reshape(-1, k).index_select(0, at),
            counts=self.counts,
        )


@dataclass
class RouteEntries:
    """A call's flipped (token, layer) pairs, compact: what leaves the device."""

    token: torch.Tensor  # (M,) int64 flat position b·T + t of each pair, ascending
    layer: torch.Tensor  # (M,) int16 its layer
    mu: torch.Tensor  # (M, k) int16 S_μ there, sorted
    pi: torch.Tensor  # (M, k) int16 S_π there, sorted
    counts: torch.Tensor  # (3, L) int64 per layer: MoE tokens, flipped tokens, Σ |S_μ ∩ S_π|

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.token, self.layer, self.mu, self.pi, self.counts

    def lists(self, index: torch.Tensor) -> tuple[RouteLists, np.ndarray]:
        """(the expert-set lists of the rows at flat positions `index` (N,) ascending, the
        per-layer counts) as numpy on the host; every pair lies at one of those rows."""
        token = self.token.cpu()
        offsets = torch.searchsorted(token, index.cpu()).numpy().astype(np.int32)
        offsets = np.append(offsets, np.int32(len(token)))
        # copies: the host tensors of an accelerator's call are reused once its rows are taken
        layer, mu, pi, counts = (t.cpu().numpy().copy() for t in (self.layer, self.mu, self.pi, self.counts))
        return RouteLists(offsets, layer, mu, pi), counts


def check_routing(
    mu: object, pi: object, shape: tuple[int, int], num_experts: object
) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """(mu, pi, the bound of expert ids) checked for shape and type, or None when neither is
    given. ValueError when only one side is given, either is not an integer (B, T, L, k) tensor
    like token_ids, the sides' L or k differ, or num_experts is not an integer in [1, 2¹⁵)."""
    if mu is None and pi is None:
        if num_experts is not None:
            raise ValueError("num_experts was given without mu_routed_experts and pi_routed_experts")
        return None
    if mu is None or pi is None:
        given, missing = ARGS if pi is None else ARGS[::-1]
        raise ValueError(
            f"{given} was given without {missing}: routing compares the engine's experts with the trainer's, "
            "pass both as (B, T, L, k) integer tensors (−1 on dense layers)"
        )
    for name, t in zip(ARGS, (mu, pi), strict=True):
        if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            got = f"dtype {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be an integer tensor of expert ids (B, T, L, k), got {got}")
        if t.dim() != 4 or tuple(t.shape[:2]) != shape or 0 in t.shape[2:]:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}; expected (B, T, L, k) = {(*shape, 'L', 'k')} like token_ids, "
                "L ≥ 1 layers and k ≥ 1 experts per token"
            )
    assert isinstance(mu, torch.Tensor) and isinstance(pi, torch.Tensor)
    if mu.shape[2] != pi.shape[2]:
        raise ValueError(f"mu_routed_experts has {mu.shape[2]} layers and pi_routed_experts {pi.shape[2]}: one model's")
    if mu.shape[3] != pi.shape[3]:
        raise ValueError(
            f"mu_routed_experts has k = {mu.shape[3]} experts per token and pi_routed_experts k = {pi.shape[3]}: "
            "the engine and the trainer must route with the same top-k"
        )
    if num_experts is None:
        return mu, pi, EXPERT_BOUND
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or not 1 <= num_experts <= EXPERT_BOUND:
        raise ValueError(f"num_experts must be an integer in [1, {EXPERT_BOUND}], got {num_experts!r}")
    return mu, pi, num_experts


def _bad_ids(mu: torch.Tensor, pi: torch.Tensor, mask: torch.Tensor, bound: int) -> dict[str, torch.Tensor]:
    """What makes a valid position's routing wrong, each (B, T, L) bool: an id outside [−1, bound),
    a set mixing −1 with expert ids, a layer dense on one side only."""
    valid = mask[..., None]
    dense = [(t == -1).all(-1) for t in (mu, pi)]
    out = {}
    for name, t, d in zip(ARGS, (mu, pi), dense, strict=True):
        out[f"{name} holds an expert id outside [-1, {bound})"] = valid & ((t < -1) | (t >= bound)).any(-1)
        out[f"{name} mixes -1 (dense) with expert ids in one layer's set"] = valid & (t == -1).any(-1) & ~d
    out["a layer is dense (-1) on one side and routed on the other"] = valid & (dense[0] != dense[1])
    return out


def derive_routing(
    mu: torch.Tensor, pi: torch.Tensor, mask: torch.Tensor, bound: int
) -> tuple[dict[str, torch.Tensor], RouteSnapshot, torch.Tensor, Callable[[], None]]:
    """(the route columns {name: (B, T) float32}, the snapshot, a bool flag: True when the
    routing is wrong at a valid position, the check that raises naming it). No host
    synchronisation; `mask` (B, T) bool on the experts' device."""
    k = mu.shape[3]
    mu, pi = mu.detach().to(mask.device), pi.detach().to(mask.device)
    bad = _bad_ids(mu, pi, mask, bound)
    flag = torch.stack([b.any() for b in bad.values()]).any()

    def explain() -> None:
        for what, where in bad.items():
            if bool(where.any()):
                raise ValueError(f"{what} at (b, t, layer) = {_first_index(where)}, a valid position")

    mu_set = mu.to(torch.int16).sort(-1).values  # (B, T, L, k)
    pi_set = pi.to(torch.int16).sort(-1).values
    moe = mask[..., None] & ~(mu_set == -1).all(-1)  # (B, T, L) valid positions of MoE layers
    shared = (mu_set[..., :, None] == pi_set[..., None, :]).any(-1).sum(-1) * moe  # (B, T, L) |S_μ ∩ S_π|
    flipped = moe & (mu_set != pi_set).any(-1)
    flips = flipped.sum(-1)  # (B, T)
    n_moe = moe.sum(-1)
    first = torch.where(flips > 0, flipped.to(torch.uint8).argmax(-1), -1)
    overlap = torch.where(n_moe > 0, shared.sum(-1) / (k * n_moe.clamp(min=1)), -1.0)
    columns = {
        "route_flips": flips.float(),
        "route_first_flip": first.float(),
        "route_overlap": overlap.float(),
    }
    counts = torch.stack([moe.sum((0, 1)), flipped.sum((0, 1)), shared.sum((0, 1))]).long()  # (3, L)
    return columns, RouteSnapshot(flipped, mu_set, pi_set, counts), flag, explain
