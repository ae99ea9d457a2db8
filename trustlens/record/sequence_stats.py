"""The per-response statistics a `TokenRecorder` stores on every token row (trustlens.rules.sequence):
Σ log(π/μ), Σ log(π/π_old) and the token count of each response of a `record` call, so that the
sequence-level rules are decided exactly at record time and again from the stored columns of a
sampled run (`Keep`), by `with_rules` and `threshold_sweep`, without torch.

A response is the rows of one sample id in one `record` call (one (step, update, sample)): a loop
that records a response's tokens over several calls gets the statistics of each part.
"""

from __future__ import annotations

import numpy as np


def sequence_statistics(
    sample: np.ndarray,  # (N,) int64 sample id of each row
    pi_logp: np.ndarray,  # (N,) log π(a_t)
    anchor_logp: np.ndarray,  # (N,) log μ(a_t), or log π_old(a_t) in a call without μ
    old_logp: np.ndarray | None,  # (N,) log π_old(a_t); None when not given
) -> dict[str, np.ndarray | None]:
    """{"seq_logratio_mu", "seq_logratio_old", "seq_tokens"}: each row's response's Σ log(π/anchor),
    Σ log(π/π_old) (None without π_old), float64 sums over the float32 values the run stores (so that
    a decision from the stored columns equals the recorder's), and its token count (int32).
    A token where both log-probs are −inf makes its response's sum NaN; one −inf makes it ±inf."""
    _, inverse, counts = np.unique(sample, return_inverse=True, return_counts=True)
    stored_pi = pi_logp.astype(np.float32).astype(np.float64)

    def total(anchor: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):  # −inf − (−inf) = NaN: a response no policy can produce
            diff = stored_pi - anchor.astype(np.float32).astype(np.float64)
            return np.bincount(inverse, weights=diff, minlength=len(counts))[inverse]

    return {
        "seq_logratio_mu": total(anchor_logp),
        "seq_logratio_old": None if old_logp is None else total(old_logp),
        "seq_tokens": counts[inverse].astype(np.int32),
    }


__all__ = ["sequence_statistics"]
