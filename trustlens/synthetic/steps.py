"""The draws of trustlens.synthetic: one step of a synthetic run at a time (`_Generator`), of
the sizes `_Shape`. A step looks like a GRPO/DPPO step on a small vocabulary:

* μ (rollout) log-probabilities are long-tailed: most sampled tokens are near-certain, a tail
  reaches 1e-9; the sampled token's id (and text) is rarer the less likely it was.
* π_old is μ plus training-inference mismatch: Gaussian noise on the token's logit
  log(p/(1−p)), larger for unlikely tokens, with rare outliers.
* π is π_old moved by the update: towards the token when its advantage is positive, away when it
  is negative, further for later minibatch updates, plus noise.
* Rewards are 0/1 with a success rate that rises over training; advantages are group-normalised
  (GRPO) and broadcast to the tokens.
* `drift` (trustlens.synthetic.drift.Drift) adds the slow healthy drift of a long run: a
  learning-rate warm-up, entropy decline, grad-norm decay, mismatch drift, held-out evaluations.
* `collapse_at` injects a collapse from that step on: mismatch noise grows, entropy falls, the
  reward and the success rate drop, and the gradient norm spikes.

Every derived column (ratio, binary and top-K divergences, `blocked_<rule>`) is computed from
those log-probabilities (natural logs; the KLs are in nats) with trustlens' own functions
(trustlens.divergence, trustlens.rules), so analyses of a synthetic run are analyses of a
consistent run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from trustlens.run.parts import TokenBatch
from trustlens.synthetic.drift import NO_DRIFT, Drift


@dataclass(frozen=True)
class _Shape:
    """Sizes of a synthetic run, checked once."""

    steps: int  # training steps
    samples_per_step: int  # responses per step, over all ranks
    seq_len: int  # maximum response length in tokens
    group_size: int  # responses per prompt (GRPO group)
    updates: int  # minibatch updates per step; each sample belongs to one
    world_size: int  # data-parallel ranks; each records its share of the samples


def _check_shape(shape: _Shape) -> None:
    for name in ("steps", "samples_per_step", "seq_len", "group_size", "updates", "world_size"):
        value = getattr(shape, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if shape.samples_per_step % shape.group_size:
        raise ValueError(
            f"samples_per_step ({shape.samples_per_step}) must be a multiple of group_size ({shape.group_size})"
        )
    if shape.samples_per_step < shape.world_size:
        raise ValueError(
            f"samples_per_step ({shape.samples_per_step}) must be at least world_size "
            f"({shape.world_size}) so that every rank records samples"
        )


def _collapse_level(step: int, collapse_at: int | None) -> float:
    """0 before the collapse, rising to 1 over three steps from `collapse_at` on."""
    if collapse_at is None or step < collapse_at:
        return 0.0
    return min(1.0, (step - collapse_at + 1) / 3.0)


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
    """log σ(x) = −log(1 + e^{−x}), stable for any x."""
    return -np.logaddexp(0.0, -x)


def _logit_of_logp(logp: np.ndarray) -> np.ndarray:
    """log(p/(1−p)) from log p < 0."""
    return logp - np.log(-np.expm1(logp))


class _Generator:
    """Draws one step of tokens, samples and metrics at a time (see the module docstring)."""

    def __init__(
        self,
        shape: _Shape,
        rng: np.random.Generator,
        vocab: list[str],
        rules: list[str],
        collapse_at: int | None,
        with_mu: bool,
        with_old: bool,
        with_topk: bool,
        drift: Drift = NO_DRIFT,
    ):
        self.shape, self.rng, self.rules, self.collapse_at, self.drift = shape, rng, rules, collapse_at, drift
        self.with_mu, self.with_old, self.with_topk = with_mu, with_old, with_topk
        self.vocab = np.asarray(vocab, dtype=object)
        self.vocab_arrow = pa.array(vocab, pa.string())

    def step(self, step: int) -> dict[str, pa.Table]:
        """One step's tables: {"batches": [(rank, TokenBatch)], "samples", "metrics"}."""
        s, rng = self.shape, self.rng
        c = _collapse_level(step, self.collapse_at)
        lr, entropy_factor, grad_factor, mismatch_factor = self.drift.factors(step, s.steps)
        n = s.samples_per_step
        sample_ids = np.arange(n, dtype=np.int64) + step * n
        ranks = (np.arange(n) * s.world_size // n).astype(np.int16)
        updates = (np.arange(n) * s.updates // n).astype(np.int16)
        lengths = rng.integers(max(1, s.seq_len // 2), s.seq_len + 1, size=n).astype(np.int32)

        # Rewards: success rate rises with training and falls with the collapse.
        success = (0.2 + 0.5 * step / max(1, s.steps - 1)) * (1.0 - 0.8 * c)
        rewards = (rng.random(n) < success).astype(np.float32)
        by_group = rewards.reshape(-1, s.group_size)
        adv_seq = (by_group - by_group.mean(1, keepdims=True)) / (by_group.std(1, keepdims=True) + 1e-6)
        adv_seq = adv_seq.reshape(-1).astype(np.float32)

        # Token rows, sample-major then position.
        owner = np.repeat(np.arange(n), lengths)
        starts = np.cumsum(lengths) - lengths
        pos = (np.arange(owner.size) - np.repeat(starts, lengths)).astype(np.int32)
        floats, token_ids, blocked, entropy = self._tokens(
            c, adv_seq[owner], updates[owner], lr, entropy_factor, mismatch_factor
        )
        batches = self._batches(step, sample_ids, ranks, updates, owner, pos, token_ids, floats, blocked)
        text = self.vocab[token_ids]
        groups = sample_ids // s.group_size
        samples = {
            "step": pa.array(np.full(n, step, np.int32)),
            "rank": pa.array(ranks),
            "sample": pa.array(sample_ids),
            "group": pa.array(groups),
            "prompt": pa.array([f"Problem {g}: what is {g % 97} + {g % 89}?" for g in groups]),
            "response": pa.array(["".join(text[a : a + m]) for a, m in zip(starts, lengths, strict=True)]),
            "reward": pa.array(rewards),
            "advantage": pa.array(adv_seq),
            "length": pa.array(lengths),
        }
        metrics = self._metrics(step, c, ranks, owner, rewards, entropy, lengths, grad_factor, success)
        return {"batches": batches, "samples": pa.table(samples), "metrics": metrics}

    def _tokens(
        self,
        c: float,  # collapse level, 0–1
        adv: np.ndarray,  # (N,) each token's advantage
        update: np.ndarray,  # (N,) each token's minibatch update
        lr: float,  # update size factor (Drift)
        entropy_factor: float,  # entropy factor (Drift)
        mismatch_factor: float,  # mismatch noise factor (Drift)
    ) -> tuple[dict[str, np.ndarray | None], np.ndarray, dict[str, np.ndarray | None], np.ndarray]:
        """(float32 columns, token ids, blocked_<rule> columns, float64 entropy) of a step's N token
        rows (the module docstring's draws)."""
        rng, total = self.rng, adv.size
        # μ: a near-certain bulk and a long tail; the collapse makes the model over-confident.
        bulk = rng.random(total) < 0.65 + 0.15 * c
        nll = np.where(bulk, rng.exponential(0.03, total), rng.gamma(1.2, 2.5, total))
        mu_logp = -np.clip(nll, 1e-6, 20.0)
        token_ids = np.clip(np.abs(rng.normal(0, 3, total)) + 12 * nll, 0, len(self.vocab) - 1).astype(np.int32)

        # π_old: mismatch noise on the logit, larger for unlikely tokens, with rare outliers.
        sigma = (0.03 * mismatch_factor + 0.6 * c) * (1 + 0.3 * nll) * np.where(rng.random(total) < 0.002, 10.0, 1.0)
        old_logit = _logit_of_logp(mu_logp) + rng.normal(0, 1, total) * sigma
        old_logp = np.minimum(_log_sigmoid(old_logit), -1e-7)
        # π: the update moves the token towards (A > 0) or away from (A ≤ 0) π_old, more in later updates.
        push = 0.15 * lr * np.sign(adv) * (1 + 0.5 * update)
        noise = rng.standard_t(3, total) * (0.1 * lr + 0.5 * c)
        pi_logp = np.minimum(_log_sigmoid(old_logit + push + noise), -1e-7)
        anchor = mu_logp if self.with_mu else old_logp

        tv, kl = _binary_divergences(pi_logp, anchor)
        rest = -np.expm1(anchor)  # 1 − μ: mass the top-K view can move among other tokens
        spread = np.abs(rng.normal(0, 1, total)) * sigma * 0.05
        topk_tv = np.minimum(1.0, tv + rest * spread)
        topk_kl = kl + rest * spread**2

        entropy = entropy_factor * (0.3 * (1 - 0.85 * c) + 0.5 * nll * (1 - 0.5 * c)) * rng.lognormal(0, 0.2, total)
        blocked = _blocked(
            self.rules,
            pi_logp,
            anchor,
            adv,
            old_logp if self.with_old else None,
            topk_tv if self.with_topk else None,
            topk_kl if self.with_topk else None,
        )

        def col(x: np.ndarray, present: bool = True) -> np.ndarray | None:
            return x.astype(np.float32) if present else None

        floats = {
            "mu_logp": col(mu_logp, self.with_mu),
            "old_logp": col(old_logp, self.with_old),
            "pi_logp": col(pi_logp),
            "ratio": col(np.exp(pi_logp - anchor)),
            "binary_tv": col(tv),
            "binary_kl": col(kl),
            "topk_tv": col(topk_tv, self.with_topk),
            "topk_kl": col(topk_kl, self.with_topk),
            "entropy": col(entropy),
            "advantage": col(adv),
        }
        return floats, token_ids, blocked, entropy

    def _batches(
        self,
        step: int,
        sample_ids: np.ndarray,  # (n,) the step's sample ids
        ranks: np.ndarray,  # (n,) each sample's rank
        updates: np.ndarray,  # (n,) each sample's update
        owner: np.ndarray,  # (N,) each token row's sample index
        pos: np.ndarray,  # (N,) each token row's position
        token_ids: np.ndarray,  # (N,)
        floats: dict[str, np.ndarray | None],  # (N,) columns
        blocked: dict[str, np.ndarray | None],  # (N,) blocked_<rule> columns
    ) -> list[tuple[int, TokenBatch]]:
        """One (rank, TokenBatch) per (rank, update), as each rank's recorder sees one record call
        per update."""
        s = self.shape
        groups = sample_ids // s.group_size
        batches = []
        for key in np.unique(ranks.astype(np.int64) * s.updates + updates):
            rows = np.flatnonzero((ranks[owner].astype(np.int64) * s.updates + updates[owner]) == key)
            batch = TokenBatch(
                step=step,
                update=int(key % s.updates),
                sample=sample_ids[owner[rows]],
                group=groups[owner[rows]],
                pos=pos[rows],
                token_id=token_ids[rows],
                floats={k: None if v is None else v[rows] for k, v in floats.items()},
                blocked={r: None if m is None else m[rows] for r, m in blocked.items()},
            )
            batches.append((int(key // s.updates), batch))
        return batches

    def _metrics(
        self,
        step: int,
        c: float,
        ranks: np.ndarray,
        owner: np.ndarray,
        rewards: np.ndarray,
        entropy: np.ndarray,
        lengths: np.ndarray,
        grad_factor: float,
        success: float,
    ) -> pa.Table:
        """Per-rank scalars, as a trainer logs them: reward, entropy, grad norm and response
        length (block rates are read from the token rows, as for any run), and with a drift's
        evaluations rank 0's `eval/accuracy`."""
        names: list[str] = []
        values: list[float] = []
        rank_col: list[int] = []
        token_rank = ranks[owner]
        for r in range(self.shape.world_size):
            mine, tok = ranks == r, token_rank == r
            grad = 0.5 * grad_factor * self.rng.lognormal(0, 0.15) * (1 + 20 * c * self.rng.lognormal(0, 0.5))
            row = {
                "reward/mean": float(rewards[mine].mean()),
                "entropy/mean": float(entropy[tok].mean()),
                "grad_norm": grad,
                "response_length/mean": float(lengths[mine].mean()),
            }
            if r == 0 and self.drift.evaluates(step):
                row["eval/accuracy"] = float(self.rng.binomial(self.drift.eval_size, success)) / self.drift.eval_size
            names += list(row)
            values += list(row.values())
            rank_col += [r] * len(row)
        k = len(names)
        return pa.table(
            {
                "step": pa.array(np.full(k, step, np.int32)),
                "rank": pa.array(np.asarray(rank_col, np.int16)),
                "name": pa.array(names),
                "value": pa.array(np.asarray(values, np.float64)),
            }
        )


def _binary_divergences(pi_logp: np.ndarray, mu_logp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Binary TV and KL(μ‖π) of each token, from trustlens.divergence (float64)."""
    import torch

    from trustlens.divergence import binary_kl, binary_tv

    pi, mu = torch.from_numpy(pi_logp), torch.from_numpy(mu_logp)
    return binary_tv(pi, mu).numpy(), binary_kl(pi, mu).numpy()


def _blocked(
    rules: list[str],
    pi_logp: np.ndarray,
    anchor: np.ndarray,
    adv: np.ndarray,
    old_logp: np.ndarray | None,
    topk_tv: np.ndarray | None,
    topk_kl: np.ndarray | None,
) -> dict[str, np.ndarray | None]:
    """Every rule's decision per token, from trustlens.rules.evaluate_all; None for a rule whose
    inputs were not recorded (its column stays null, as the recorder leaves it)."""
    import torch

    from trustlens.rules import evaluate_all, get_rule

    def t(x: np.ndarray | None):
        return None if x is None else torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))

    given = {"old_logp": t(old_logp), "topk_tv": t(topk_tv), "topk_kl": t(topk_kl)}
    # the per-response rules and weights are left out: a synthetic run has no response statistics
    able = [r for r in rules if all(given.get(arg) is not None for arg in get_rule(r).needs)]
    out = evaluate_all(able, pi_logp=t(pi_logp), mu_logp=t(anchor), advantages=t(adv), **given) if able else {}
    return {r: out[r].numpy() if r in out else None for r in rules}
