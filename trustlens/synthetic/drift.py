"""The slow healthy drift of a long run (`Drift`), for synthetic runs that look like the runs
users train for thousands of steps: a learning-rate warm-up, an entropy that declines as the
policy sharpens, a gradient norm that decays, a mismatch that drifts up, and held-out
evaluations of a success rate that rises.

At step t of T steps (τ = t / (T − 1)):

    learning rate factor    lr(t) = min(1, (t + 1) / warmup_steps)      (1 without a warm-up)
    update size             π moves from π_old by lr(t) times the push of trustlens.synthetic.steps
    entropy factor          1 − entropy_decline · τ
    grad-norm factor        lr(t) · grad_decay^τ
    mismatch noise factor   √(mismatch_drift)^τ: the k3 mismatch (∝ σ²) grows by mismatch_drift
    held-out accuracy       every eval_every steps, Binomial(eval_size, success rate) / eval_size
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Drift:
    """The healthy drift of a synthetic run (module docstring)."""

    warmup_steps: int = 50  # steps of linear learning-rate warm-up (0: none); run.json `warmup_steps`
    entropy_decline: float = 0.4  # the entropy falls by this fraction over the run
    grad_decay: float = 0.5  # the gradient norm ends at this fraction of its start
    mismatch_drift: float = 2.0  # the k3 mismatch ends at this multiple of its start
    eval_every: int = 25  # steps between held-out evaluations (`eval/accuracy`; 0: none)
    eval_size: int = 256  # problems per evaluation

    def __post_init__(self) -> None:
        for name in ("warmup_steps", "eval_every", "eval_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Drift.{name} must be an int ≥ 0, got {value!r}")
        if not 0 <= self.entropy_decline < 1:
            raise ValueError(f"Drift.entropy_decline must be in [0, 1), got {self.entropy_decline!r}")
        for name in ("grad_decay", "mismatch_drift"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Drift.{name} must be > 0, got {getattr(self, name)!r}")

    def lr(self, step: int) -> float:
        """The learning-rate factor at `step`."""
        return 1.0 if self.warmup_steps == 0 else min(1.0, (step + 1) / self.warmup_steps)

    def factors(self, step: int, steps: int) -> tuple[float, float, float, float]:
        """(update size, entropy, grad norm, mismatch noise) factors at `step` of `steps`."""
        tau = step / max(1, steps - 1)
        lr = self.lr(step)
        return lr, 1.0 - self.entropy_decline * tau, lr * self.grad_decay**tau, math.sqrt(self.mismatch_drift) ** tau

    def evaluates(self, step: int) -> bool:
        """Whether `step` has a held-out evaluation."""
        return self.eval_every > 0 and step % self.eval_every == 0


NO_DRIFT = Drift(warmup_steps=0, entropy_decline=0.0, grad_decay=1.0, mismatch_drift=1.0, eval_every=0)

__all__ = ["NO_DRIFT", "Drift"]
