import math

import polars as pl
import pytest

from trustlens.analysis.buckets import bucket_expr, bucket_table
from trustlens.analysis.tokens import (
    TokenQuery,
    alert_query,
    alert_tokens,
    anchor_column,
    filter_tokens,
    query_expr,
    rules_of,
    sample_summary,
    sample_text,
    sample_tokens,
    step_range,
    updates_of_sample,
)


def _tokens(mu: bool = True) -> pl.LazyFrame:
    """Two steps, three samples, hand-written values."""
    rows = [
        # step update sample pos token      mu    adv   ppo    tv
        (0, 0, 0, 0, " The", 0.9, 1.0, False, False),
        (0, 0, 0, 1, " cat", 0.05, 1.0, True, False),
        (0, 0, 0, 2, "<b>", 0.001, 1.0, True, True),
        (0, 0, 1, 0, " the", 0.5, -0.5, False, None),
        (0, 0, 1, 1, " dog", 0.2, -0.5, True, True),
        (1, 0, 2, 0, " THE", 0.99, 0.0, False, False),
        (1, 1, 2, 0, " THE", 0.99, 0.0, True, False),
        (1, 0, 2, 1, " end", 0.3, None, False, False),
    ]
    cols = ["step", "update", "sample", "pos", "token", "mu", "advantage", "blocked_ppo", "blocked_dppo_binary_tv"]
    df = pl.DataFrame(rows, schema=cols, orient="row")
    df = df.with_columns(
        pl.col("step").cast(pl.Int32),
        pl.col("update").cast(pl.Int16),
        pl.col("pos").cast(pl.Int32),
        pl.lit(7, pl.Int32).alias("token_id"),
        (pl.col("mu").log().cast(pl.Float32) if mu else pl.lit(None, pl.Float32)).alias("mu_logp"),
        (pl.col("mu").log() - 0.01).cast(pl.Float32).alias("old_logp"),
        (pl.col("mu").log() - 0.02).cast(pl.Float32).alias("pi_logp"),
        pl.col("advantage").cast(pl.Float32),
    ).drop("mu")
    return df.lazy()


def _ids(lf: pl.LazyFrame) -> list[tuple[int, int, int]]:
    return sorted(lf.select("sample", "update", "pos").collect().rows())


def test_rules_and_anchor():
    assert rules_of(_tokens()) == ["ppo", "dppo_binary_tv"]
    assert anchor_column(_tokens()) == "mu_logp"
    assert anchor_column(_tokens(mu=False)) == "old_logp"
    assert anchor_column(_tokens(), mu_recorded=False) == "old_logp"
    assert anchor_column(_tokens().drop("mu_logp")) == "old_logp"


def test_each_filter_alone():
    t = _tokens()
    assert _ids(filter_tokens(t, TokenQuery(steps=(1, 1)))) == [(2, 0, 0), (2, 0, 1), (2, 1, 0)]
    assert _ids(filter_tokens(t, TokenQuery(decisions=(("ppo", True),)))) == [
        (0, 0, 1),
        (0, 0, 2),
        (1, 0, 1),
        (2, 1, 0),
    ]
    assert _ids(filter_tokens(t, TokenQuery(decisions=(("ppo", False),)))) == [
        (0, 0, 0),
        (1, 0, 0),
        (2, 0, 0),
        (2, 0, 1),
    ]
    # a null decision (rule not evaluable) matches neither blocked nor passed
    assert (1, 0, 0) not in _ids(filter_tokens(t, TokenQuery(decisions=(("dppo_binary_tv", False),))))
    # μ in [0.01, 0.4): 0.05, 0.2, 0.3
    assert _ids(filter_tokens(t, TokenQuery(anchor_prob=(0.01, 0.4)))) == [(0, 0, 1), (1, 0, 1), (2, 0, 1)]
    assert _ids(filter_tokens(t, TokenQuery(advantage_sign="neg"))) == [(1, 0, 0), (1, 0, 1)]
    assert _ids(filter_tokens(t, TokenQuery(advantage_sign="zero"))) == [(2, 0, 0), (2, 1, 0)]
    assert len(_ids(filter_tokens(t, TokenQuery(advantage_sign="pos")))) == 3
    # case-insensitive literal search; "<b>" is not a regex
    assert _ids(filter_tokens(t, TokenQuery(text="the"))) == [(0, 0, 0), (1, 0, 0), (2, 0, 0), (2, 1, 0)]
    assert _ids(filter_tokens(t, TokenQuery(text="<b>"))) == [(0, 0, 2)]
    assert _ids(filter_tokens(t, TokenQuery(text="."))) == []
    assert _ids(filter_tokens(t, TokenQuery(samples=(1,)))) == [(1, 0, 0), (1, 0, 1)]
    assert len(_ids(filter_tokens(t, TokenQuery()))) == 8


def test_anchor_buckets_filter_as_bucket_expr_counts():
    """Every bucket of the sidebar's μ filter holds the rows `bucket_expr` puts in it: μ = 1
    (log-prob 0) in the top bucket [0.1, 1], μ = 0 in the lowest."""
    mu = [1.0, 0.999, 0.5, 0.1000001, 0.0999999, 0.03, 1e-3, 1e-7, 0.0]
    rows = pl.DataFrame({"mu_logp": pl.Series([math.log(m) if m else -math.inf for m in mu], dtype=pl.Float64)})
    rows = rows.with_row_index("pos").with_columns(bucket=bucket_expr("mu_logp"))
    table = bucket_table()
    for b in table.iter_rows(named=True):
        kept = rows.lazy().filter(query_expr(TokenQuery(anchor_prob=(b["p_lo"], b["p_hi"])), rules=[]))
        assert kept.collect()["pos"].to_list() == rows.filter(pl.col("bucket") == b["bucket"])["pos"].to_list()
    top = rows.lazy().filter(query_expr(TokenQuery(anchor_prob=(0.1, 1.0)), rules=[])).collect()
    assert top["pos"].to_list() == [0, 1, 2, 3]


def test_two_rules_disagreeing():
    q = TokenQuery(decisions=(("ppo", True), ("dppo_binary_tv", False)))
    assert _ids(filter_tokens(_tokens(), q)) == [(0, 0, 1), (2, 1, 0)]


def test_filters_combine_with_and():
    q = TokenQuery(steps=(0, 0), decisions=(("ppo", True),), advantage_sign="pos", anchor_prob=(0.0, 0.01))
    assert _ids(filter_tokens(_tokens(), q)) == [(0, 0, 2)]


def test_anchor_bucket_uses_pi_old_without_mu():
    t = _tokens(mu=False)
    # π_old = μ·e^{-0.01}: 0.9 → 0.891 falls in [0.85, 0.9)
    rows = _ids(filter_tokens(t, TokenQuery(anchor_prob=(0.85, 0.9)), anchor=anchor_column(t)))
    assert rows == [(0, 0, 0)]


@pytest.mark.parametrize(
    "query, message",
    [
        (TokenQuery(steps=(3, 1)), r"query.steps: first step 3 is after last step 1"),
        (
            TokenQuery(decisions=(("ppo", True), ("cispo", False))),
            r"rule 'cispo' was not evaluated in this run \(evaluated: ppo, dppo_binary_tv\)",
        ),
        (TokenQuery(anchor_prob=(0.5, 0.5)), r"query.anchor_prob must be 0 ≤ lo < hi"),
        (TokenQuery(advantage_sign="up"), r"query.advantage_sign must be one of"),
    ],
)
def test_bad_queries_name_the_field(query, message):
    with pytest.raises(ValueError, match=message):
        filter_tokens(_tokens(), query)


def test_sample_summary_counts_and_order():
    s = sample_summary(filter_tokens(_tokens(), TokenQuery(steps=(0, 0))))
    assert s.columns == ["step", "update", "sample", "rows", "blocked_ppo", "blocked_dppo_binary_tv", "advantage"]
    assert s.rows() == [(0, 0, 0, 3, 2, 1, 1.0), (0, 0, 1, 2, 1, 1, -0.5)]
    assert sample_summary(_tokens(), limit=1).height == 1


def test_sample_tokens_one_update_in_order():
    df = sample_tokens(_tokens(), 2)
    assert df["pos"].to_list() == [0, 1] and set(df["update"]) == {0}
    assert df.columns[-2:] == ["blocked_ppo", "blocked_dppo_binary_tv"]
    df1 = sample_tokens(_tokens(), 2, step=1, update=1)
    assert df1["pos"].to_list() == [0] and df1["blocked_ppo"].to_list() == [True]
    assert sample_tokens(_tokens(), 99).is_empty()
    assert math.isclose(sample_tokens(_tokens(), 0)["mu_logp"][1], math.log(0.05), rel_tol=1e-6)
    assert updates_of_sample(_tokens(), 2) == [0, 1]


def test_sample_text_and_step_range():
    samples = pl.LazyFrame({"step": [0, 0], "sample": [0, 1], "prompt": ["p0", "p1"], "response": ["r0", "r1"]})
    assert sample_text(samples, 1)["prompt"] == "p1"
    assert sample_text(samples, 5) is None
    assert step_range(_tokens()) == (0, 1)
    assert step_range(_tokens().filter(pl.col("step") > 5)) is None


def test_alert_query_and_tokens():
    alert = {
        "step": 0,
        "samples": [1, 0],
        "tokens": [
            {"sample": 1, "update": 0, "pos": 1},
            {"sample": 0, "update": 0, "pos": 2},
            {"sample": 9, "update": 0, "pos": 0},
        ],
    }
    q = alert_query(alert)
    assert q == TokenQuery(steps=(0, 0), samples=(1, 0))
    assert len(_ids(filter_tokens(_tokens(), q))) == 5
    assert alert_query({"step": 1, "samples": []}).samples is None
    rows = alert_tokens(_tokens(), alert)
    assert rows.select("sample", "pos").rows() == [(1, 1), (0, 2)]  # alert order; unknown token dropped
    assert rows["token"].to_list() == [" dog", "<b>"]


def test_a_query_takes_lists_and_numpy_ints_and_keeps_tuples():
    import numpy as np

    q = TokenQuery(steps=[np.int64(0), 1], samples=[2, np.int32(3)], decisions=[["ppo", True]], anchor_prob=[0, 1])
    assert q == TokenQuery(steps=(0, 1), samples=(2, 3), decisions=(("ppo", True),), anchor_prob=(0.0, 1.0))
    assert type(q.steps[0]) is int and type(q.samples[1]) is int and hash(q) == hash(TokenQuery(**vars(q)))
