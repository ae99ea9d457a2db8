"""`certify(run)` and `trustlens certify RUN`: is the rollout engine's μ equal to the trainer's
π_old, bit for bit, as batch-invariant and deterministic inference claim (docs/certify.md)?

    tokens       the tokens compared, the input checks (μ, π_old, lag, staleness, sampled runs),
                 each column's recorded precision (float32 or bf16)
    compare      the bit comparison of each sampled token, where it differs (position, prefill vs
                 decode, batch rows, decode batch) and the top-K distribution at update 0
    certificate  the verdict (bit-exact, within precision, not equal) and the requirements a CI
                 job can ask for (bit-exact, precision, distribution)
    command      the command: exit 0 certified, 1 not, 2 bad input
"""

from __future__ import annotations

from trustlens.analysis.certify.certificate import REQUIREMENTS, VERDICTS, Certificate, certify
from trustlens.analysis.certify.compare import TOPK_TOLERANCE
from trustlens.analysis.certify.tokens import CertifyInputError, column_precision

__all__ = [
    "REQUIREMENTS",
    "TOPK_TOLERANCE",
    "VERDICTS",
    "Certificate",
    "CertifyInputError",
    "certify",
    "column_precision",
]
