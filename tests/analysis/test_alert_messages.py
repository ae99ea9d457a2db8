"""Alert messages write numbers as every page does (trustlens.core.numbers): block rates in
percent, other values as plain decimals or 1.6e-4, never 1.6e-05."""

from trustlens.analysis.collapse import alert_message
from trustlens.analysis.collapse.detectors import Episode


def _episode(kind, signal, value, baseline, step=5, end_step=7):
    return Episode(kind, signal, step, end_step, value, baseline, 0.0, None, False, end_row=end_step)


def test_a_block_rate_is_written_in_percent():
    text = alert_message(_episode("blocked_drift", "blocked_ppo", 0.0213, 0.005))
    assert text == (
        "steps 5–7: the share of A ≠ 0 tokens the active rule ppo blocks moved to 2.13 % "
        "from a baseline of 0.5 % (4.3× baseline)"
    )


def test_a_small_value_is_written_without_a_padded_exponent():
    text = alert_message(_episode("mismatch_growth", "k3_kl", 1.6e-4, 1.6e-5, step=9, end_step=9))
    assert text == "step 9: training-inference mismatch (k3_kl) grew to 1.6e-4 from a baseline of 1.6e-5 (10× baseline)"
