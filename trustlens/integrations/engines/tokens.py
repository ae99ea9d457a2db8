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
    support_ids     (B, T, S) int64 those ids, S the largest support; −1 after them
    weight_version  (B, T) int64    where the engine returned weight versions: the version of the
                                    weights that sampled the token; −1 where not known and on padding
    mu_routed_experts (B, T, L, k) int64  a mixture-of-experts model's routed experts where the engine
                                    returned them (trustlens.integrations.engines.routing); −1 on
                                    dense layers and padding

What `TokenRecorder.record` takes of the last three: `support_size`, `pi_support_mass(logits, τ)`
(Σ π over each support) and `staleness(version)`; `record_args(logits=…, temperature=…,
trainer_version=…)` adds them where the engine returned them.

Where an engine gave fewer than K ids at a position (a vocabulary smaller than K, a server that
trims), the set is filled with ids it does not hold at log μ = −inf (probability 0); on padding
the top-K is ids 0..K−1 at −inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# one response: its ids, log μ of each, per position the engine's (id, log μ) candidates, the
# sampling support's ids per position (None: no mask) and the weight version per position (None)
Response = tuple[list[int], list[float], list[list[tuple[int, float]]], list[list[int]] | None, list[int] | None]


@dataclass
class EngineTokens:
    """A batch of responses as an engine reported them (shapes and pad values: module docstring)."""

    token_ids: torch.Tensor  # (B, T) int64
    response_mask: torch.Tensor  # (B, T) bool
    mu_logp: torch.Tensor  # (B, T) float32
    mu_topk_ids: torch.Tensor | None = None  # (B, T, K) int64
    mu_topk_logp: torch.Tensor | None = None  # (B, T, K) float32
    support_size: torch.Tensor | None = None  # (B, T) int64
    support_ids: torch.Tensor | None = None  # (B, T, S) int64
    weight_version: torch.Tensor | None = None  # (B, T) int64
    mu_routed_experts: torch.Tensor | None = None  # (B, T, L, k) int64, −1 on dense layers and padding

    def record_args(
        self, *, logits: torch.Tensor | None = None, temperature: float = 1.0, trainer_version: int | None = None
    ) -> dict[str, torch.Tensor]:
        """The keyword arguments of `TokenRecorder.record` these tensors fill: the ids, mask,
        log μ and μ's top-K; with routed experts `mu_routed_experts` (pass the trainer's
        `pi_routed_experts` to `record` too); with a sampling mask `support_size` (and with π's `logits`, (B, T, V)
        before the temperature, `pi_support_mass`); with weight versions and `trainer_version`
        (the version of the weights π is computed with) `staleness`. Pass `logits` and
        `temperature` to `record` as well: the recorder takes them for its own columns."""
        args = {"token_ids": self.token_ids, "response_mask": self.response_mask, "mu_logp": self.mu_logp}
        if self.mu_topk_ids is not None and self.mu_topk_logp is not None:
            args.update(mu_topk_ids=self.mu_topk_ids, mu_topk_logp=self.mu_topk_logp)
        if self.mu_routed_experts is not None:  # record needs pi_routed_experts beside it
            args["mu_routed_experts"] = self.mu_routed_experts
        if self.support_size is not None:
            args["support_size"] = self.support_size.float()
            if logits is not None:
                args["pi_support_mass"] = self.pi_support_mass(logits, temperature)
        if self.weight_version is not None and trainer_version is not None:
            args["staleness"] = self.staleness(trainer_version)
        return args

    def pi_support_mass(self, logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """(B, T) float32: Σ π over each token's sampling support, π = softmax(logits / τ) from
        π's `logits` (B, T, V) before the temperature; 0 on padding. With a μ renormalised over
        the support (processed log-probs), log μ(a_t) − (log π(a_t) − log Σ π) is the mismatch
        the truncation leaves. ValueError without sampling masks or for logits of another shape."""
        if self.support_ids is None:
            raise ValueError("no sampling masks: the engine's outputs carried none (return_sampling_mask)")
        B, T, _ = self.support_ids.shape
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or tuple(logits.shape[:2]) != (B, T):
            got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(f"logits must be a (B, T, V) = ({B}, {T}, V) tensor, got {got}")
        logp = torch.log_softmax(logits.detach().double() / temperature, -1)  # (B, T, V)
        held = self.support_ids >= 0  # (B, T, S)
        picked = logp.gather(-1, self.support_ids.clamp(min=0).to(logp.device))  # (B, T, S)
        mass = picked.masked_fill(~held.to(logp.device), -math.inf).logsumexp(-1).exp()  # (B, T)
        return (mass * self.response_mask.to(mass.device)).clamp(max=1.0).float()

    def staleness(self, trainer_version: int) -> torch.Tensor:
        """(B, T) float32: how many weight updates behind `trainer_version` (the version of the
        weights π is computed with) each token's weights were, trainer_version − weight_version;
        0 on padding. ValueError without weight versions, where a token's version is not known, or
        where it is newer than `trainer_version`."""
        if self.weight_version is None:
            raise ValueError("no weight versions: the engine's outputs carried none")
        valid = self.response_mask
        if bool((valid & (self.weight_version < 0)).any()):
            b, t = (int(i) for i in torch.nonzero(valid & (self.weight_version < 0))[0])
            raise ValueError(
                f"response {b}, position {t}: its weight version is not known (not an integer, e.g. SGLang's "
                "'default' before the first weight update)"
            )
        lag = torch.where(valid, trainer_version - self.weight_version, torch.zeros_like(self.weight_version))
        if bool((lag < 0).any()):
            raise ValueError(f"trainer_version {trainer_version} is older than a token's weight version")
        return lag.float()


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
    masked = [r[3] for r in responses if r[3] is not None]
    support = torch.zeros((B, T), dtype=torch.long) if masked else None
    widest = max((len(s) for sets in masked for s in sets), default=1)
    support_ids = torch.full((B, T, widest), -1, dtype=torch.long) if masked else None
    versions = torch.full((B, T), -1, dtype=torch.long) if any(r[4] is not None for r in responses) else None
    for b, (ids, logps, candidates, sets, weights) in enumerate(responses):
        n = len(ids)
        token_ids[b, :n] = torch.tensor(ids, dtype=torch.long)
        mask[b, :n] = True
        mu_logp[b, :n] = torch.tensor(logps, dtype=torch.float32)
        if support is not None and support_ids is not None and sets is not None:
            support[b, :n] = torch.tensor([len(s) for s in sets], dtype=torch.long)
            for t, ids_t in enumerate(sets):
                support_ids[b, t, : len(ids_t)] = torch.tensor(ids_t, dtype=torch.long)
        if versions is not None and weights is not None:
            versions[b, :n] = torch.tensor(weights, dtype=torch.long)
        if top_ids is not None and top_logp is not None and topk is not None:
            for t in range(n):
                k_ids, k_logp = _top_k(ids[t], logps[t], candidates[t], topk)
                top_ids[b, t] = torch.tensor(k_ids)
                top_logp[b, t] = torch.tensor(k_logp, dtype=torch.float32)
    return EngineTokens(token_ids, mask, mu_logp, top_ids, top_logp, support, support_ids, versions)


__all__ = ["EngineTokens", "Response", "log_prob", "padded", "token_id"]
