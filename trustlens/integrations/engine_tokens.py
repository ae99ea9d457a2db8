"""`EngineTokens`: a batch of responses as a rollout engine reported them, right-padded into the
tensors `TokenRecorder.record` takes (trustlens.integrations.engines reads the engines' outputs
into it).

    token_ids       (B, T) int64    the sampled ids; `pad_id` (default 0) after each response
    response_mask   (B, T) bool     True on the generated tokens
    mu_logp         (B, T) float32  log μ(a_t) as the engine reported it; 0.0 on padding
    mu_topk_ids     (B, T, K) int64 with `topk=K`: μ's K most likely ids of the position, most likely
                                    first, the sampled id forced in (it replaces the K-th when it is
                                    not among them, as docs/rules.md asks); else None
    mu_topk_logp    (B, T, K) float32 their log μ
    support_size    (B, T) int64    where the engine returned its sampling mask: the number of ids
                                    the token was drawn from (after top-p / top-k / min-p); 0 on padding
                                    and in a response without a mask
    weight_version  (B, T) int64    where the engine returned weight versions: the version of the
                                    weights that sampled the token; −1 where not known and on padding

Where an engine gave fewer than K ids at a position (a vocabulary smaller than K, a server that
trims), the set is filled with ids it does not hold at log μ = −inf (probability 0); on padding
the top-K is ids 0..K−1 at −inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# one response: its ids, log μ of each, per position the engine's (id, log μ) candidates, the
# sampling support's size per position (None: no mask) and the weight version per position (None)
Response = tuple[list[int], list[float], list[list[tuple[int, float]]], list[int] | None, list[int] | None]


@dataclass
class EngineTokens:
    """A batch of responses as an engine reported them (shapes and pad values: module docstring)."""

    token_ids: torch.Tensor  # (B, T) int64
    response_mask: torch.Tensor  # (B, T) bool
    mu_logp: torch.Tensor  # (B, T) float32
    mu_topk_ids: torch.Tensor | None = None  # (B, T, K) int64
    mu_topk_logp: torch.Tensor | None = None  # (B, T, K) float32
    support_size: torch.Tensor | None = None  # (B, T) int64
    weight_version: torch.Tensor | None = None  # (B, T) int64

    def record_args(self) -> dict[str, torch.Tensor]:
        """The keyword arguments of `TokenRecorder.record` these tensors fill."""
        args = {"token_ids": self.token_ids, "response_mask": self.response_mask, "mu_logp": self.mu_logp}
        if self.mu_topk_ids is not None and self.mu_topk_logp is not None:
            args.update(mu_topk_ids=self.mu_topk_ids, mu_topk_logp=self.mu_topk_logp)
        return args

    def staleness(self, trainer_version: int) -> torch.Tensor:
        """(B, T) int64: how many weight updates behind `trainer_version` (the version of the
        weights the trainer computes π with) each token's weights were, trainer_version −
        weight_version; −1 where the version is not known and on padding. ValueError without
        weight versions."""
        if self.weight_version is None:
            raise ValueError("no weight versions: the engine's outputs carried none (module docstring)")
        known = self.weight_version >= 0
        return torch.where(known, trainer_version - self.weight_version, torch.full_like(self.weight_version, -1))


def token_id(where: str, value: object) -> int:
    """`value` as a token id; ValueError naming `where` unless an int in [0, 2³¹)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise ValueError(f"{where}: token id must be an int in [0, 2³¹), got {value!r}")
    return value


def log_prob(where: str, value: object, hint: str = "") -> float:
    """`value` as a log-probability (≤ 0, −inf allowed, +1e-4 of rounding clamped to 0);
    ValueError naming `where` (and `hint`, what may have gone wrong) otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value > 1e-4:
        raise ValueError(f"{where}: log-probability must be a number ≤ 0 (−inf allowed), got {value!r}{hint}")
    return min(float(value), 0.0)


def _top_k(token: int, logp: float, candidates: list[tuple[int, float]], k: int) -> tuple[list[int], list[float]]:
    """The K most likely of `candidates` (most likely first), `token` forced in (it replaces the
    K-th), filled with ids not held at −inf when fewer than K."""
    ids: list[int] = []
    logps: list[float] = []
    for i, lp in candidates:
        if i not in ids and len(ids) < k:
            ids.append(i)
            logps.append(lp)
    if token not in ids:
        if len(ids) == k:
            ids.pop()
            logps.pop()
        ids.append(token)
        logps.append(logp)
    fill = (i for i in range(2 * k + 1) if i not in ids)
    while len(ids) < k:
        ids.append(next(fill))
        logps.append(-math.inf)
    return ids, logps


def padded(responses: list[Response], *, topk: int | None, pad_id: int, length: int | None) -> EngineTokens:
    """`EngineTokens` of `responses`, right-padded to the longest (or to `length`)."""
    if not responses:
        raise ValueError("no responses: outputs/responses must hold at least one")
    pad_id = token_id("pad_id", pad_id)
    longest = max(len(r[0]) for r in responses)
    T = longest if length is None else length
    if isinstance(T, bool) or not isinstance(T, int) or longest > T:
        raise ValueError(f"length must be an int ≥ the longest response ({longest} tokens), got {length!r}")
    B = len(responses)
    token_ids = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.bool)
    mu_logp = torch.zeros((B, T), dtype=torch.float32)
    top_ids = top_logp = None
    if topk is not None:
        top_ids = torch.arange(topk).expand(B, T, topk).clone()
        top_logp = torch.full((B, T, topk), -math.inf, dtype=torch.float32)
    support = torch.zeros((B, T), dtype=torch.long) if any(r[3] is not None for r in responses) else None
    versions = torch.full((B, T), -1, dtype=torch.long) if any(r[4] is not None for r in responses) else None
    for b, (ids, logps, candidates, sizes, weights) in enumerate(responses):
        n = len(ids)
        token_ids[b, :n] = torch.tensor(ids, dtype=torch.long)
        mask[b, :n] = True
        mu_logp[b, :n] = torch.tensor(logps, dtype=torch.float32)
        if support is not None and sizes is not None:
            support[b, :n] = torch.tensor(sizes, dtype=torch.long)
        if versions is not None and weights is not None:
            versions[b, :n] = torch.tensor(weights, dtype=torch.long)
        if top_ids is not None and top_logp is not None and topk is not None:
            for t in range(n):
                k_ids, k_logp = _top_k(ids[t], logps[t], candidates[t], topk)
                top_ids[b, t] = torch.tensor(k_ids)
                top_logp[b, t] = torch.tensor(k_logp, dtype=torch.float32)
    return EngineTokens(token_ids, mask, mu_logp, top_ids, top_logp, support, versions)


__all__ = ["EngineTokens", "Response", "log_prob", "padded", "token_id"]
