"""Synthetic recorded runs in the exact run format, for tests, demos and benchmarks.

- `writer`: `write_synthetic_run`, which draws and writes a run step by step.
- `steps`: how each step's log-probabilities, advantages and collapse are drawn.
- `drift`: `Drift`, the slow healthy drift of a long run (warm-up, entropy decline, grad-norm
  decay, mismatch drift, held-out evaluations).
- `vocab`: the small vocabularies the runs' token text comes from (`HOSTILE_VOCAB` holds text
  that tries to break whatever renders it).
"""

from trustlens.synthetic.drift import Drift
from trustlens.synthetic.vocab import HOSTILE_VOCAB, VOCAB
from trustlens.synthetic.writer import DEFAULT_RULES, expected_token_rows, write_synthetic_run

__all__ = ["DEFAULT_RULES", "HOSTILE_VOCAB", "VOCAB", "Drift", "expected_token_rows", "write_synthetic_run"]
