import numpy as np
import polars as pl
import pytest
import torch

from trustlens.analysis import (
    blocked_by_advantage_sign,
    blocked_by_bucket,
    blocked_by_token,
    blocked_per_step,
    confusion_matrix,
    figure1_density,
    rule_boundaries,
    rule_confusion,
    with_rules,
)
from trustlens.divergence import binary_kl

TV = "dppo_binary_tv"


def _rows(df: pl.DataFrame, *cols: str) -> list[tuple]:
    return [tuple(r) for r in df.select(cols).iter_rows()]


def test_blocked_per_step(clip_run):
    df = blocked_per_step(clip_run.tokens)
    # block rates are over A ≠ 0 tokens: the two A = 0 rows of step 1 are not counted
    assert _rows(df, "step", "rule", "count", "blocked") == [
        (0, "ppo", 4, 2),
        (0, TV, 4, 1),
        (1, "ppo", 2, 2),
        (1, TV, 2, 1),
    ]
    assert df["blocked_frac"].to_list() == pytest.approx([0.5, 0.25, 1.0, 0.5])


def test_blocked_by_token_orders_by_count_then_fraction(clip_run):
    df = blocked_by_token(clip_run.tokens)
    assert _rows(df, "rule", "token", "count", "blocked") == [
        ("ppo", "b", 2, 2),
        ("ppo", "a", 3, 2),
        (TV, "a", 3, 2),
    ]
    assert _rows(blocked_by_token(clip_run.tokens, "ppo", top=1), "token") == [("b",)]
    assert blocked_by_token(clip_run.tokens, "ppo", min_count=3)["token"].to_list() == ["a"]


def test_blocked_by_bucket(clip_run):
    df = blocked_by_bucket(clip_run.tokens, "ppo")
    assert df["label"].to_list()[0] == "< 1e-05" and df.height == 6
    # μ: 1e-7 → bucket 0; 0.002 → 3; 0.02, 0.05 → 4; 0.3, 0.5, 0.6, 0.9 → 5
    assert _rows(df, "bucket", "count", "blocked") == [(0, 1, 0), (1, 0, 0), (2, 0, 0), (3, 1, 1), (4, 1, 1), (5, 3, 2)]
    assert df["blocked_frac"].to_list()[1] is None
    two = blocked_by_bucket(clip_run.tokens, min_p=1e-4, per_decade=2)
    assert two.filter(pl.col("rule") == "ppo")["count"].sum() == 6  # the 2 A = 0 rows are not counted


def test_blocked_by_advantage_sign(clip_run):
    df = blocked_by_advantage_sign(clip_run.tokens)
    assert _rows(df, "sign", "rule", "count", "blocked") == [
        ("pos", "ppo", 2, 2),
        ("neg", "ppo", 4, 2),
        ("zero", "ppo", 2, 0),
        ("pos", TV, 2, 1),
        ("neg", TV, 4, 1),
        ("zero", TV, 1, 0),
    ]


def test_rule_confusion(clip_run):
    df = rule_confusion(clip_run.tokens, "ppo", TV)
    assert _rows(df, "step", "count", "both", "only_a", "only_b", "neither") == [(0, 4, 1, 1, 0, 2), (1, 2, 1, 1, 0, 0)]
    assert df["agreement"].to_list() == pytest.approx([0.75, 0.5])  # A = 0 rows do not inflate it
    total = rule_confusion(clip_run.tokens, "ppo", TV, per_step=False)
    assert _rows(total, "count", "both", "only_a", "only_b", "neither") == [(6, 2, 2, 0, 2)]


def test_confusion_matrix(clip_run):
    df = confusion_matrix(clip_run.tokens)
    assert _rows(df, "rule_a", "rule_b", "count", "only_a") == [
        ("ppo", "ppo", 6, 0),
        ("ppo", TV, 6, 2),
        (TV, "ppo", 6, 0),
        (TV, TV, 6, 0),
    ]
    assert df["only_a_frac"][1] == pytest.approx(2 / 6)


def test_unknown_rule_is_named(clip_run):
    with pytest.raises(ValueError, match="'cispo' not evaluated in this run"):
        blocked_per_step(clip_run.tokens, ["ppo", "cispo"])


def test_figure1_density(clip_run):
    df = figure1_density(clip_run.tokens, "ratio", rules=["ppo"], n_x=6, n_y=2)
    # x bins are decades of μ from 1e-6; y bin 0 is ratio < 1, 1 is ratio ≥ 1
    cells = {(r["x_bin"], r["y_bin"]): (r["count"], r["blocked_ppo"]) for r in df.iter_rows(named=True)}
    assert cells == {(0, 1): (1, 0), (3, 0): (1, 1), (4, 1): (2, 1), (5, 0): (1, 1), (5, 1): (3, 1)}
    nonzero = {(r["x_bin"], r["y_bin"]): r["count_nonzero"] for r in df.iter_rows(named=True)}
    assert nonzero[(4, 1)] == 1 and nonzero[(5, 1)] == 2  # μ = 0.05 and 0.3 have A = 0
    row = df.filter(pl.col("x_bin") == 3).row(0, named=True)
    assert (row["x_lo"], row["x_hi"], row["y_lo"], row["y_hi"]) == pytest.approx((1e-3, 1e-2, 0.1, 1.0))
    tv = figure1_density(clip_run.tokens, "binary_tv", n_x=6, n_y=4, y_range=(0.0, 0.2))
    assert tv["count"].sum() == 8
    assert tv.filter(pl.col("y_bin") == 3)["count"].sum() == 2  # TV 0.2 clipped into the top bin
    with pytest.raises(ValueError, match="y_range"):
        figure1_density(clip_run.tokens, "ratio", y_range=(1.0, 1.0))


def test_rule_boundaries_closed_forms():
    df = rule_boundaries(
        {"ppo": {"low": 0.2, "high": 0.3}, TV: {}, "dppo_binary_kl": {}, "dppo_topk_tv": {}, "minirl": {}, "cispo": {}},
        n=50,
    )
    assert set(df["rule"].unique()) == {"ppo", TV, "dppo_binary_kl"}
    ppo = df.filter(pl.col("rule") == "ppo")
    assert ppo.filter(pl.col("side") == "upper")["ratio"].to_numpy() == pytest.approx(1.3)
    assert ppo.filter(pl.col("side") == "lower")["ratio"].to_numpy() == pytest.approx(0.8)
    lower = ppo.filter(pl.col("side") == "lower")
    np.testing.assert_allclose(lower["tv"], 0.2 * lower["mu"])
    tv = df.filter(pl.col("rule") == TV)
    np.testing.assert_allclose(tv["tv"], 0.15)
    assert (tv.filter(pl.col("side") == "upper")["mu"] < 0.85).all()
    assert (tv.filter(pl.col("side") == "lower")["mu"] > 0.15).all()
    kl = df.filter(pl.col("rule") == "dppo_binary_kl")
    got = binary_kl(torch.tensor(np.log(kl["pi"].to_numpy())), torch.tensor(np.log(kl["mu"].to_numpy())))
    np.testing.assert_allclose(got.numpy(), 0.05, rtol=1e-6)
    up = kl.filter(pl.col("side") == "upper")
    assert (up["pi"] > up["mu"]).all()


def test_empty_table(clip_run):
    empty = clip_run.tokens.filter(pl.lit(False))
    assert blocked_per_step(empty).is_empty()
    assert blocked_by_token(empty).is_empty()
    assert blocked_by_bucket(empty)["count"].sum() == 0
    assert blocked_by_advantage_sign(empty)["count"].sum() == 0
    assert rule_confusion(empty, "ppo", TV).is_empty()
    assert confusion_matrix(empty)["count"].sum() == 0
    assert figure1_density(empty).is_empty()


def test_with_rules_decides_unrecorded_rules_on_the_columns(clip_run):
    tokens = with_rules(clip_run.tokens, ["ppo", "dppo_binary_tv", "ppo_clip_higher"])
    df = tokens.select("ratio", "advantage", "blocked_ppo", "blocked_ppo_clip_higher").collect()
    # DAPO's clip-higher: A > 0 blocked above ratio 1.28 (rows 0: 1.4 and 1: 2), A < 0 below 0.8
    assert df["blocked_ppo_clip_higher"].to_list() == [True, True, False, False, True, True, False, False]
    # a recorded rule keeps its recorded column
    assert df["blocked_ppo"].to_list() == [True, True, False, False, True, True, False, False]
    # a custom rule from a manifest entry, compared like any other
    custom = {"low": 0.05, "high": 0.05, "anchor": "mu", "measure": "binary_tv"}
    confusion = rule_confusion(with_rules(clip_run.tokens, ["tight"], base={"tight": custom}), "ppo", "tight")
    assert confusion["count"].sum() == 6
    # minirl reads π_old, null in this run: not evaluated on any row
    minirl = with_rules(clip_run.tokens, ["minirl"]).select("blocked_minirl").collect()
    assert minirl["blocked_minirl"].null_count() == 8
    with pytest.raises(ValueError, match="minirl"):
        with_rules(clip_run.tokens.drop("old_logp"), ["minirl"])
