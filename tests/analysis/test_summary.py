import pytest

from trustlens.analysis import step_summary
from trustlens.analysis.summary import SUMMARY_COLUMNS, step_summary_query


def test_step_summary_by_hand(clip_run):
    df = step_summary(clip_run.tokens)
    assert df.columns == [
        "step",
        "tokens",
        "samples",
        "mean_advantage",
        "entropy",
        "ratio_mean",
        "ratio_max",
        "binary_tv_mean",
        "binary_tv_max",
        "zero_adv_frac",
        "blocked_ppo",
        "blocked_dppo_binary_tv",
    ]
    s0, s1 = df.iter_rows(named=True)
    assert (s0["step"], s0["tokens"], s0["samples"]) == (0, 4, 2)
    assert s0["mean_advantage"] == 0.0 and s0["entropy"] is None
    assert s0["ratio_mean"] == pytest.approx((1.4 + 2 + 0.95 / 0.9 + 10) / 4, rel=1e-6)
    assert s0["ratio_max"] == pytest.approx(10, rel=1e-6)
    assert s0["binary_tv_max"] == pytest.approx(0.2, rel=1e-6)
    assert (s0["blocked_ppo"], s0["blocked_dppo_binary_tv"]) == (0.5, 0.25)
    # block rates over A ≠ 0 tokens: step 1 has 2 A = 0 rows (one with a null TV decision)
    assert (s0["zero_adv_frac"], s1["zero_adv_frac"]) == (0.0, 0.5)
    assert (s1["blocked_ppo"], s1["blocked_dppo_binary_tv"]) == (1.0, 0.5)
    assert s1["mean_advantage"] == pytest.approx(-0.5)


def test_empty(clip_run):
    assert step_summary(clip_run.tokens.head(0)).is_empty()


def test_columns_computes_only_what_is_asked(clip_run):
    full = step_summary(clip_run.tokens)
    assert step_summary_query(clip_run.tokens).collect_schema().names() == full.columns
    assert full.columns == ["step", *SUMMARY_COLUMNS, "blocked_ppo", "blocked_dppo_binary_tv"]
    part = step_summary(clip_run.tokens, columns=("entropy", "blocked_dppo_binary_tv"))
    assert part.columns == ["step", "entropy", "blocked_dppo_binary_tv"]
    assert part.equals(full.select(part.columns))
    only = step_summary_query(clip_run.tokens, rules=["dppo_binary_tv"]).collect_schema().names()
    assert [c for c in only if c.startswith("blocked_")] == ["blocked_dppo_binary_tv"]
