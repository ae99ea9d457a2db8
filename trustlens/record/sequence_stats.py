"""The per-response statistics a `TokenRecorder` stores on every token row (trustlens.rules.sequence):
Σ log(π/μ), Σ log(π/π_old) and the token count of each response of a `record` call, so that the
sequence-level rules are decided exactly at record time and again from the stored columns of a
sampled run (`Keep`), by `with_rules` and `threshold_sweep`, without torch.

A response is the rows of one sample id in one `record` call (one (step, update, sample)): a loop
that records a response's tokens over several calls gets the statistics of each part.
"""

from __future__ import annotations

import numpy as np

from trustlens.rules import sequence


def sequence_statistics(
    sample: np.ndarray,  # (N,) int64 sample id of each row
    pi_logp: np.ndarray,  # (N,) log π(a_t)
    anchor_logp: np.ndarray,  # (N,) log μ(a_t), or log π_old(a_t) in a call without μ
    old_logp: np.ndarray | None,  # (N,) log π_old(a_t); None when not given
) -> dict[str, np.ndarray | None]:
    """{"seq_logratio_mu", "seq_logratio_old", "seq_tokens"} of each row's response
    (trustlens.rules.sequence.sequence_statistics): float64 sums over the float32 values the run
    stores (so that a decision from the stored columns equals the recorder's), None without π_old,
    and the token count (int32)."""
    _, inverse, counts = np.unique(sample, return_inverse=True, return_counts=True)

    def stored(logp: np.ndarray | None) -> np.ndarray | None:
        return None if logp is None else logp.astype(np.float32).astype(np.float64)

    def over_response(values: np.ndarray) -> np.ndarray:
        return np.bincount(inverse, weights=values, minlength=len(counts))[inverse]

    tokens = counts[inverse].astype(np.int32)
    return sequence.sequence_statistics(stored(pi_logp), stored(anchor_logp), stored(old_logp), over_response, tokens)


__all__ = ["sequence_statistics"]
