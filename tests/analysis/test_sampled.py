"""Analyses of a sampled run (recorded with Keep): exact per-step numbers from its aggregates, equal
to those of the same run recorded in full; weighted estimates from its kept rows alone; a weighted
query on a hand-built table checked by hand."""

import math
import shutil

import polars as pl
import pyarrow.parquet as pq
import pytest

from trustlens import Keep
from trustlens.analysis import (
    blocked_by_advantage_sign,
    blocked_per_step,
    exact_aggregates,
    mismatch_per_step,
    rule_confusion,
    step_signals,
    step_summary,
)
from trustlens.analysis.clipping import figure1_density
from trustlens.analysis.paper_findings import blocked_anchor_quantiles
from trustlens.analysis.sweep import threshold_sweep
from trustlens.run import load_run
from trustlens.run.tables import write_run
from trustlens.synthetic import write_synthetic_run

SIZES = {"steps": 6, "samples_per_step": 64, "seq_len": 48, "updates": 2, "world_size": 2, "seed": 3}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(full, sampled): one synthetic run recorded in full and with Keep(rate=0.05)."""
    root = tmp_path_factory.mktemp("sampled")
    full = load_run(write_synthetic_run(root / "full", **SIZES))
    sampled = load_run(write_synthetic_run(root / "sampled", **SIZES, keep=Keep(rate=0.05, seed=1)))
    return full, sampled


def test_the_sample_keeps_few_rows(pair):
    full, sampled = pair
    assert sampled.sampled and not full.sampled
    rows, all_rows = sampled.tokens.collect().height, full.tokens.collect().height
    assert rows < 0.6 * all_rows  # the synthetic tail (μ < 0.1) is large: many rows matter
    assert exact_aggregates(full) is None
    assert sampled.aggregates.select(pl.col("tokens").sum()).collect().item() == all_rows


def test_step_summary_is_exact_with_the_aggregates(pair):
    full, sampled = pair
    want = step_summary(full.tokens)
    got = step_summary(sampled.tokens, aggregates=exact_aggregates(sampled))
    # no samples column: the kept rows hold only some samples, and the aggregates do not count them
    assert got.columns == [c for c in want.columns if c != "samples"]
    assert got["step"].to_list() == want["step"].to_list()
    assert got["tokens"].to_list() == want["tokens"].to_list()
    exact = ["zero_adv_frac", *(c for c in want.columns if c.startswith("blocked_"))]
    for column in exact:
        assert got[column].to_list() == pytest.approx(want[column].to_list(), abs=1e-12), column
    # the mean entropy from the aggregates' float64 sum, the full run's from its float32 rows
    assert got["entropy"].to_list() == pytest.approx(want["entropy"].to_list(), rel=1e-6)


def test_aggregates_without_the_entropy_sum_leave_the_weighted_estimate(pair, tmp_path):
    """A sampled run recorded before the aggregates held the entropy sum: its mean entropy per
    step is the weighted mean of the kept rows, as it was."""
    _, sampled = pair
    old = tmp_path / "old"
    shutil.copytree(sampled.path, old)
    for part in old.glob("aggregates/rank=*/part-*.parquet"):
        table = pq.read_table(part)
        pq.write_table(table.drop_columns(["entropy_n", "sum_entropy"]), part)
    run = load_run(old)
    got = step_summary(run.tokens, aggregates=exact_aggregates(run))
    assert got["entropy"].to_list() == step_summary(run.tokens)["entropy"].to_list()


def test_step_summary_computes_only_the_columns_asked_for(pair):
    full, sampled = pair
    for run, aggregates in ((full, None), (sampled, exact_aggregates(sampled))):
        whole = step_summary(run.tokens, aggregates=aggregates)
        some = step_summary(run.tokens, aggregates=aggregates, columns=("blocked_ppo", "entropy"))
        assert some.columns == ["step", "entropy", "blocked_ppo"]  # the summary's order
        assert some.equals(whole.select(some.columns))
        with pytest.raises(ValueError, match=r"columns\[2\] must be one of .*got 'no_such'"):
            step_summary(run.tokens, aggregates=aggregates, columns=("blocked_ppo", "entropy", "no_such"))


def test_blocked_per_step_is_exact_with_the_aggregates(pair):
    full, sampled = pair
    want = blocked_per_step(full.tokens)
    got = blocked_per_step(sampled.tokens, aggregates=exact_aggregates(sampled))
    assert got.select("step", "rule", "count", "blocked").equals(want.select("step", "rule", "count", "blocked"))


def test_a_step_range_limits_the_aggregates(pair):
    _, sampled = pair
    got = blocked_per_step(sampled.tokens.filter(pl.col("step") <= 2), aggregates=exact_aggregates(sampled, (1, 2)))
    assert sorted(set(got["step"])) == [1, 2]


def test_token_level_mismatch_is_exact_with_the_aggregates(pair):
    full, sampled = pair
    want = mismatch_per_step(full.tokens)
    got = mismatch_per_step(sampled.tokens, aggregates=exact_aggregates(sampled))
    assert got["tokens"].to_list() == want["tokens"].to_list()
    for column in ("mismatch_kl", "k3_kl", "chi2_token", "prob_diff_mean", "prob_diff_max", "prob_pearson"):
        assert got[column].to_list() == pytest.approx(want[column].to_list(), rel=1e-9, abs=1e-12), column


def test_collapse_signals_of_a_sampled_run_are_its_exact_ones(pair):
    full, sampled = pair
    want, got = step_signals(full), step_signals(sampled)
    for column in ("k3_kl", "prob_diff_mean", "blocked_ppo", "blocked_dppo_binary_tv"):
        assert got[column].to_list() == pytest.approx(want[column].to_list(), rel=1e-9, abs=1e-12), column
    assert got["entropy"].to_list() == pytest.approx(want["entropy"].to_list(), rel=1e-6)


def test_weighted_rows_estimate_the_full_numbers(pair):
    full, sampled = pair
    want = step_summary(full.tokens)
    guess = step_summary(sampled.tokens)  # no aggregates: Σ weight and weighted means
    # ~1,000 random-share tokens a step at rate 0.05, weight 20: σ ≈ 20·√(1000·0.05·0.95) ≈ 140 a
    # step, ≈ 340 over the run's ~13,700 tokens
    assert guess["tokens"].sum() == pytest.approx(want["tokens"].sum(), abs=4 * 340)
    for column in ("zero_adv_frac", "blocked_ppo", "blocked_dppo_binary_tv"):
        assert guess[column].to_list() == pytest.approx(want[column].to_list(), abs=0.05), column
    # unweighted, the kept rows overstate the block rate: every token the active rule (ppo, the
    # synthetic run's first) blocks is kept
    kept_rate = sampled.tokens.filter(pl.col("advantage") != 0).select(pl.col("blocked_ppo").mean()).collect().item()
    full_rate = full.tokens.filter(pl.col("advantage") != 0).select(pl.col("blocked_ppo").mean()).collect().item()
    assert kept_rate > full_rate + 0.05


def test_weights_count_by_hand(tmp_path):
    """Four kept rows: two that matter (weight 1, one blocked) and two of the random share
    (weight 10): they stand for 22 tokens, 1 blocked."""
    tokens = {
        "step": [0, 0, 0, 0],
        "sample": [0, 0, 1, 1],
        "pos": [0, 1, 0, 1],
        "pi_logp": [math.log(0.9)] * 4,
        "mu_logp": [math.log(0.5), math.log(0.9), math.log(0.9), math.log(0.9)],
        "advantage": [1.0, 1.0, -1.0, 0.0],
        "weight": [1.0, 1.0, 10.0, 10.0],
        "entropy": [1.0, 2.0, 3.0, 4.0],
        "blocked_ppo": [True, False, False, False],
    }
    run = load_run(write_run(tmp_path / "r", tokens=tokens))
    summary = step_summary(run.tokens).row(0, named=True)
    assert summary["tokens"] == 22
    assert summary["zero_adv_frac"] == pytest.approx(10 / 22)
    assert summary["blocked_ppo"] == pytest.approx(1 / 12)  # of the 12 A ≠ 0 tokens
    assert summary["entropy"] == pytest.approx((1 + 2 + 30 + 40) / 22)
    by_sign = {r["sign"]: (r["count"], r["blocked"]) for r in blocked_by_advantage_sign(run.tokens).to_dicts()}
    assert by_sign == {"pos": (2, 1), "neg": (10, 0), "zero": (10, 0)}
    pair = rule_confusion(run.tokens, "ppo", "ppo", per_step=False).row(0, named=True)
    assert (pair["count"], pair["both"], pair["neither"]) == (12, 1, 11)


def test_run_outcomes_of_a_sampled_run_are_exact(pair):
    from trustlens.analysis import run_outcomes

    full, sampled = pair
    want, got = run_outcomes([full]).row(0, named=True), run_outcomes([sampled]).row(0, named=True)
    for column, value in want.items():
        if column.startswith(("block", "k3", "tv")):
            assert value is not None, column
            assert got[column] == pytest.approx(value, rel=1e-9, abs=1e-12), column


def test_a_run_whose_aggregates_gained_the_entropy_sum_midway_loads(pair, tmp_path):
    """A sampled run recorded before the aggregates held the entropy sum and resumed after: its
    older parts (every rank's first) lack the columns; the steps they cover keep the rows'
    weighted estimate, the others are exact."""
    _, sampled = pair
    mixed = tmp_path / "mixed"
    shutil.copytree(sampled.path, mixed)
    old_steps = {0, 1, 2}
    for rank in (0, 1):
        (first,) = mixed.glob(f"aggregates/rank={rank}/part-*.parquet")
        table = pl.read_parquet(first)
        old, new = table.filter(pl.col("step").is_in(old_steps)), table.filter(~pl.col("step").is_in(old_steps))
        old.drop("entropy_n", "sum_entropy").write_parquet(first)
        new.write_parquet(first.with_name("part-999999.parquet"))
    run = load_run(mixed)
    got = step_summary(run.tokens, aggregates=exact_aggregates(run))
    estimate = step_summary(run.tokens)["entropy"]
    exact = step_summary(sampled.tokens, aggregates=exact_aggregates(sampled))["entropy"]
    assert 0 < len(old_steps) < got.height
    for i, step in enumerate(got["step"]):
        want = estimate[i] if step in old_steps else exact[i]
        assert got["entropy"][i] == pytest.approx(want, rel=1e-12), step


def test_where_blocked_tokens_sit_in_mu_is_estimated_from_the_weighted_rows(pair):
    full, sampled = pair
    rules = ["ppo", "dppo_binary_tv"]
    want = blocked_anchor_quantiles(full.tokens, rules)
    got = blocked_anchor_quantiles(sampled.tokens, rules)
    # every token ppo (the active rule) blocks is kept, and here every token dppo_binary_tv blocks
    # is rare or of top divergence: the blocked rows' quantiles are the full run's
    assert got.filter(pl.col("rule") != "all tokens").equals(want.filter(pl.col("rule") != "all tokens"))
    # all tokens: the kept rows hold every μ < 0.1 token, so unweighted their median μ is 0.04;
    # weighted it estimates the full run's 0.96
    everything = got.row(0, named=True)
    assert everything["tokens"] == pytest.approx(want["tokens"][0], rel=0.05)
    assert everything["p50"] == pytest.approx(want["p50"][0], abs=0.02)
    rows_alone = blocked_anchor_quantiles(sampled.tokens.drop("weight"), rules).row(0, named=True)
    assert rows_alone["p50"] < 0.1 < want["p50"][0]


def test_the_figure_1_density_counts_the_tokens_the_rows_stand_for(pair):
    want, got = (figure1_density(run.tokens, rules=["ppo"]) for run in pair)
    assert got["count"].sum() == pytest.approx(want["count"].sum(), rel=0.05)
    assert got["blocked_ppo"].sum() == want["blocked_ppo"].sum()  # every token the active rule blocks is kept

    def low(df):  # share of the tokens with μ < 0.1
        return df.filter(pl.col("x_hi") <= 0.1 + 1e-12)["count"].sum() / df["count"].sum()

    assert low(got) == pytest.approx(low(want), abs=0.02)


def test_the_threshold_sweep_counts_the_tokens_the_rows_stand_for(pair):
    want, got = (threshold_sweep(run.tokens, ["ppo", "dppo_binary_tv"], (0.5, 1.0, 2.0)) for run in pair)
    keys = ["rule", "scale"]
    assert got.select(keys).equals(want.select(keys))
    # at scale ≥ 1 every token a rule blocks was kept with weight 1 (ppo: the active rule;
    # dppo_binary_tv: here only rare or top-divergence tokens): the same blocked counts
    at_least_one = pl.col("scale") >= 1
    assert got.filter(at_least_one)["blocked"].to_list() == want.filter(at_least_one)["blocked"].to_list()
    # counts and rates are estimates from the weighted rows; unweighted, the kept rows (all of the
    # tail and every token PPO blocks) put PPO's rate at several times the run's
    assert got["count"].to_list() == pytest.approx(want["count"].to_list(), rel=0.05)
    assert got["blocked_frac"].to_list() == pytest.approx(want["blocked_frac"].to_list(), abs=0.02)
    rows_alone = threshold_sweep(pair[1].tokens.drop("weight"), ["ppo"], (1.0,))["blocked_frac"].item()
    assert rows_alone > 2 * want.filter((pl.col("rule") == "ppo") & (pl.col("scale") == 1))["blocked_frac"].item()


@pytest.mark.parametrize("per_step", [True, False])
def test_rule_confusion_is_exact_with_the_aggregates(pair, per_step):
    full, sampled = pair
    want = rule_confusion(full.tokens, "ppo", "dppo_binary_tv", per_step=per_step)
    got = rule_confusion(sampled.tokens, "ppo", "dppo_binary_tv", per_step=per_step, aggregates=sampled.aggregates)
    assert got.columns == want.columns
    assert got.equals(want)
    estimate = rule_confusion(sampled.tokens, "ppo", "dppo_binary_tv", per_step=per_step)
    assert not estimate["neither"].equals(want["neither"])  # the kept rows alone only estimate it
    assert estimate.select("both", "only_a", "only_b").equals(want.select("both", "only_a", "only_b"))
    unrecorded = sampled.aggregates.drop("k_dppo_topk_tv_pos")  # as for a rule decided after the run
    with pytest.raises(ValueError, match="no counts of 'dppo_topk_tv'"):
        rule_confusion(sampled.tokens, "ppo", "dppo_topk_tv", aggregates=unrecorded)


@pytest.fixture(scope="module")
def pair_dppo(tmp_path_factory):
    """(full, sampled) of the synthetic run trained with dppo_binary_tv: ppo and ppo_clip_higher
    are counterfactual there, their blocked tokens drawn at the rate (those not rare)."""
    root = tmp_path_factory.mktemp("sampled_dppo")
    sizes = {**SIZES, "active_rule": "dppo_binary_tv"}
    full = load_run(write_synthetic_run(root / "full", **sizes))
    sampled = load_run(write_synthetic_run(root / "sampled", **sizes, keep=Keep(rate=0.05, seed=1)))
    return full, sampled


def test_rule_confusion_with_the_active_rule_is_exact_with_the_aggregates(pair_dppo):
    """The active rule's blocked tokens are all kept (weight 1), so `both` is exact from the rows
    and the rest from the aggregates, though the other rule's blocks were sampled."""
    full, sampled = pair_dppo
    random = sampled.tokens.filter(pl.col("blocked_ppo") & (pl.col("weight") > 1)).collect()
    assert random.height > 0  # ppo's blocked tokens are partly of the random share
    for per_step in (True, False):
        want = rule_confusion(full.tokens, "dppo_binary_tv", "ppo", per_step=per_step)
        got = rule_confusion(sampled.tokens, "dppo_binary_tv", "ppo", per_step=per_step, aggregates=sampled.aggregates)
        assert got.equals(want), per_step


def test_rule_confusion_of_two_counterfactual_rules_has_exact_margins(pair_dppo):
    """Neither rule is kept at weight 1: each rule's blocked count (both + only_x) and count are
    exact from the aggregates, `both` an unbiased estimate from the weighted rows (4 SE: SE² =
    m·(1 − rate)/rate over the m tokens of the random share both rules block)."""
    full, sampled = pair_dppo
    want = rule_confusion(full.tokens, "ppo", "ppo_clip_higher", per_step=False).row(0, named=True)
    got = rule_confusion(sampled.tokens, "ppo", "ppo_clip_higher", per_step=False, aggregates=sampled.aggregates).row(
        0, named=True
    )
    assert got["count"] == want["count"]
    assert got["both"] + got["only_a"] == want["both"] + want["only_a"]
    assert got["both"] + got["only_b"] == want["both"] + want["only_b"]
    assert got["neither"] >= 0 and got["only_b"] >= 0
    both = sampled.tokens.filter(pl.col("blocked_ppo") & pl.col("blocked_ppo_clip_higher")).collect()
    drawn = want["both"] - int((both["weight"] == 1).sum())
    assert got["both"] == pytest.approx(want["both"], abs=4 * math.sqrt(drawn * 0.95 / 0.05))
