"""The paper's findings located in a run: hand-built token tables with answers worked by hand."""

import math

import polars as pl
import pytest

from trustlens.analysis.buckets import weighted_quantile
from trustlens.analysis.paper_findings import (
    EXAMPLE_CASES,
    blocked_anchor_quantiles,
    blocked_token_anchor,
    motivating_examples,
    over_updates_per_step,
)

L = math.log

# (step, token, μ, π, A, blocked_ppo, blocked_dppo_binary_tv); blocked_* as the default rules decide
ROWS = [
    (0, "7", 1e-4, 5e-4, 1.0, True, False),  # rare, pushed up: ratio 5
    (0, "Wait", 0.01, 0.02, 1.0, True, False),  # rare, pushed up: ratio 2
    (0, "the", 0.3, 0.9, 1.0, True, True),  # blocked by both: not a motivating example
    (0, "=", 0.99, 0.8, -1.0, False, True),  # near-certain, pushed down by 0.19, ratio 0.81
    (1, "=", 0.95, 0.85, -1.0, False, False),  # near-certain, pushed down by 0.10
    (1, "so", 0.4, 0.3, -1.0, True, False),  # μ below 0.5: not near-certain
    (1, "7", 0.02, 0.015, -1.0, True, False),  # ratio 0.75 < 0.8
    (1, "the", 0.6, 0.6, 0.0, False, False),
]


def table(rows=ROWS) -> pl.LazyFrame:
    step, token, mu, pi, adv, ppo, tv = zip(*rows, strict=True)
    return pl.LazyFrame(
        {
            "step": list(step),
            "update": [0] * len(rows),
            "sample": list(range(len(rows))),
            "pos": [0] * len(rows),
            "token": list(token),
            "mu_logp": [L(p) for p in mu],
            "pi_logp": [L(p) for p in pi],
            "binary_tv": [abs(p - m) for m, p in zip(mu, pi, strict=True)],
            "advantage": list(adv),
            "blocked_ppo": list(ppo),
            "blocked_dppo_binary_tv": list(tv),
        }
    )


def test_motivating_examples():
    df = motivating_examples(table(), n=5)
    up = df.filter(pl.col("case") == EXAMPLE_CASES[0])
    down = df.filter(pl.col("case") == EXAMPLE_CASES[1])
    assert up["token"].to_list() == ["7", "Wait"]  # largest ratio first
    assert up["ratio"].to_list() == pytest.approx([5.0, 2.0])
    assert up["binary_tv"].to_list() == pytest.approx([4e-4, 0.01])
    assert down["sample"].to_list() == [3, 4]  # the one DPPO blocks leads
    assert down["mu"].to_list() == pytest.approx([0.99, 0.95])
    assert down["pi"].to_list() == pytest.approx([0.8, 0.85])
    assert motivating_examples(table(), n=1)["sample"].to_list() == [0, 3]


def test_motivating_examples_bad_input():
    with pytest.raises(ValueError, match="dppo_binary_kl"):
        motivating_examples(table(), divergence_rule="dppo_binary_kl")
    with pytest.raises(ValueError, match="n must"):
        motivating_examples(table(), n=0)


def test_blocked_anchor_quantiles():
    df = blocked_anchor_quantiles(table(), quantiles=(0.0, 0.5, 1.0))
    assert df["rule"].to_list() == ["all tokens", "ppo", "dppo_binary_tv"]
    assert df["tokens"].to_list() == [8, 5, 2]
    ppo = df.row(1, named=True)  # μ of the ppo-blocked: 1e-4, 0.01, 0.3, 0.4, 0.02
    assert (ppo["p0"], ppo["p50"], ppo["p100"]) == pytest.approx((1e-4, 0.02, 0.4))
    tv = df.row(2, named=True)
    assert (tv["p0"], tv["p100"]) == pytest.approx((0.3, 0.99))


def test_blocked_token_anchor():
    df = blocked_token_anchor(table(), "ppo", top=2)
    assert df["token"].to_list() == ["7", "Wait"]  # "7" blocked twice
    seven = df.row(0, named=True)
    assert (seven["count"], seven["blocked"]) == (2, 2)
    assert seven["mu_median"] == pytest.approx(math.sqrt(1e-4 * 0.02))  # median of two logs
    empty = blocked_token_anchor(table([r for r in ROWS if not r[5]]), "ppo")
    assert empty.is_empty() and "mu_median" in empty.columns


def test_over_updates_per_step():
    df = over_updates_per_step(table())
    assert df["step"].to_list() == [0, 1]
    s0, s1 = df.rows(named=True)
    assert (s0["count_pos"], s0["over_pos"], s0["count_neg"], s0["over_neg"]) == (3, 1, 1, 1)
    assert s0["over_frac_pos"] == pytest.approx(1 / 3)
    assert s0["tv_mean_pos"] == pytest.approx((4e-4 + 0.01 + 0.6) / 3)
    assert (s1["count_pos"], s1["over_neg"], s1["count_neg"]) == (0, 0, 3)  # A = 0 left out
    assert s1["over_frac_pos"] is None and s1["over_frac_neg"] == 0.0
    with pytest.raises(ValueError, match="dppo_binary_kl"):
        over_updates_per_step(table(), "dppo_binary_kl")


def test_over_updates_per_step_weighs_a_sampled_run():
    """Kept rows stand for 1/rate tokens: step 0's first two A > 0 rows with weight 10 (the
    random share of a Keep(0.1) run), the blocked one with weight 1."""
    sampled = table().with_columns(weight=pl.Series([10.0, 10.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], dtype=pl.Float32))
    s0 = over_updates_per_step(sampled).row(0, named=True)
    assert (s0["count_pos"], s0["over_pos"]) == (21, 1)
    assert s0["over_frac_pos"] == pytest.approx(1 / 21)
    assert s0["tv_mean_pos"] == pytest.approx((10 * 4e-4 + 10 * 0.01 + 0.6) / 21)


def test_weighted_quantile_by_hand():
    # x 1, 2, 3, 4 counted 1, 1, 10, 10 times: cumulative weight 1, 2, 12, 22 of 22
    df = pl.DataFrame({"x": [4.0, 1.0, None, 3.0, 2.0], "weight": [10.0, 1.0, 5.0, 10.0, 1.0]})
    got = df.select(
        *(weighted_quantile(pl.col("x"), q).alias(f"q{q}") for q in (0.0, 0.05, 0.1, 0.5, 0.6, 1.0)),
        weighted_quantile(pl.col("x"), 0.5, pl.col("x") < 3.5).alias("below"),  # 1, 2, 3: 1, 2, 12 of 12
    ).row(0)
    assert got == (1.0, 2.0, 3.0, 3.0, 4.0, 4.0, 3.0)
    assert pl.DataFrame({"x": [None], "weight": [1.0]}).select(weighted_quantile(pl.col("x"), 0.5)).item() is None


def test_quantiles_and_medians_count_each_row_its_weight():
    # a sampled run's rows: every blocked or low-μ token kept (weight 1), the rest 1 in 10
    rows = [
        (0, "a", 0.01, 0.05, 1.0, True, False),
        (0, "a", 0.02, 0.02, 1.0, False, False),
        (0, "a", 0.9, 0.9, 1.0, False, False),
    ]
    tokens = table(rows).with_columns(weight=pl.Series([1.0, 1.0, 10.0]))
    df = blocked_anchor_quantiles(tokens, ["ppo"], quantiles=(0.5,))
    assert df["tokens"].to_list() == [12, 1]
    assert df["p50"].to_list() == pytest.approx([0.9, 0.01])  # 10 of the 12 tokens sit at μ = 0.9
    unweighted = blocked_anchor_quantiles(table(rows), ["ppo"], quantiles=(0.5,))  # the rows alone
    assert unweighted["tokens"].to_list() == [3, 1] and unweighted["p50"][0] == pytest.approx(0.02)
    anchor = blocked_token_anchor(tokens, "ppo").row(0, named=True)
    assert anchor["mu_median"] == pytest.approx(0.9) and anchor["mu_median_blocked"] == pytest.approx(0.01)
