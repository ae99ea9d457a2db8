"""Alert messages write numbers as every page does (trustlens.core.numbers): block rates in
percent, other values as plain decimals or 1.6e-4, never 1.6e-05."""

from trustlens.analysis.collapse import alert_message
from trustlens.analysis.collapse.steps import Episode


def _episode(kind, signal, value, baseline, step=5, end_step=7):
    return Episode(kind, signal, step, end_step, value, baseline, 0.0, None, False, end_row=end_step)


def test_a_block_rate_is_written_in_percent():
    text = alert_message(_episode("blocked_drift_up", "blocked_ppo", 0.0213, 0.005))
    # a baseline below the detector's floor (blocked_drift = 1 %) is never the base of a factor
    assert text.startswith(
        "steps 5–7: the share of A ≠ 0 tokens the active rule ppo blocks rose to 2.13 % "
        "from a baseline of 0.5 %. Next: "
    )
    text = alert_message(_episode("blocked_drift_up", "blocked_ppo", 0.0426, 0.02))
    assert "from a baseline of 2 % (2.1× baseline). Next: open the PPO vs DPPO page at step 5" in text


def test_a_small_value_is_written_without_a_padded_exponent():
    text = alert_message(_episode("mismatch_growth", "k3_kl", 1.6e-4, 1.6e-5, step=9, end_step=9))
    assert text.startswith(
        "step 9: training-inference mismatch (k3_kl) grew to 1.6e-4 from a baseline of 1.6e-5 (10× baseline). Next: "
        "open the Mismatch page"
    )
