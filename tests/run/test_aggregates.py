"""Record-time sampling (Keep) and the exact aggregates table (trustlens.run.aggregates)."""

import math
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import torch

from trustlens import Keep, TokenRecorder, load_run
from trustlens.export import token_scalars
from trustlens.run.aggregates import _uniform, aggregate_row, per_step_scalars

RULES = ["ppo", "dppo_binary_tv", "dppo_topk_kl"]
SEQUENCE_LEVEL = {"log_ppl_diff", "log_ppl_abs_diff", "chi2_seq"}


def feed(rec, seed: int = 0, steps: int = 3, zero_old: tuple[int, int] | None = None) -> None:
    """The same tokens whatever the recorder: μ with a long tail, π moved from it, top-K given;
    `zero_old` = (step, update): there π_old gives token (1, 2) probability 0 (log π_old = −inf)."""
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        for update in range(2):
            mu = -torch.distributions.Exponential(torch.tensor(1.5)).sample((12, 20)).clamp(min=1e-7)
            mu = mu.to(torch.float32)
            pi = (mu + 0.3 * torch.randn(12, 20, generator=g)).clamp(max=0)
            topk_tv = (pi.exp() - mu.exp()).abs() + 0.01 * torch.rand(12, 20, generator=g)
            topk_kl = 0.05 * torch.rand(12, 20, generator=g)
            topk_kl[0, 3] = float("inf")  # π gives 0 to one of μ's top-K: valid, and always kept
            old = (mu + 0.05 * torch.randn(12, 20, generator=g)).clamp(max=0)
            if (step, update) == zero_old:
                old[1, 2] = -math.inf  # position 2 is inside every response (lengths ≥ 5)
            rec.record(
                step,
                update=update,
                token_ids=torch.randint(0, 50, (12, 20), generator=g),
                response_mask=torch.arange(20)[None, :] < torch.randint(5, 21, (12, 1), generator=g),
                pi_logp=pi,
                mu_logp=mu,
                old_logp=old,
                advantages=torch.randn(12, generator=g).round(),
                topk_tv=topk_tv,
                topk_kl=topk_kl,
                entropy=3 * torch.rand(12, 20, generator=g) if update == 0 else None,  # update 1: none
            )


def record(path, keep, seed: int = 0, zero_old: tuple[int, int] | None = None):
    torch.manual_seed(seed)  # the Exponential sampler draws from the global generator
    with TokenRecorder(path, rules=RULES, active_rule="ppo", keep=keep) as rec:
        feed(rec, seed, zero_old=zero_old)
    return load_run(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("keep")
    return {
        "full": record(root / "full", None),
        "all": record(root / "all", Keep(rate=1.0)),
        "sampled": record(root / "sampled", Keep(rate=0.05, seed=3)),
    }


def test_keep_is_validated():
    for bad in (
        dict(rate=0),
        dict(rate=1.5),
        dict(rate=float("nan")),
        dict(low_mu=0),
        dict(top_share=2),
        dict(seed=-1),
    ):
        with pytest.raises(ValueError, match="Keep"):
            Keep(**bad)
    with pytest.raises(ValueError, match="keep must be"):
        TokenRecorder("unused", keep=0.01)


def test_aggregates_do_not_depend_on_the_rate(runs):
    full_rows = runs["full"].tokens.select(pl.len()).collect().item()
    a, b = runs["all"].aggregates.collect(), runs["sampled"].aggregates.collect()
    assert a.equals(b) and a["tokens"].sum() == full_rows
    assert not runs["full"].sampled and runs["all"].sampled and runs["sampled"].sampled
    assert runs["full"].aggregates.collect().is_empty()
    kept = runs["sampled"].tokens.select(pl.len()).collect().item()
    assert kept < full_rows / 3 and runs["sampled"].manifest["keep"]["rate"] == 0.05


def test_aggregates_are_the_full_rows_counts_and_sums(runs):
    rows = runs["full"].tokens.collect()
    agg = runs["sampled"].aggregates.collect()
    for rule in RULES:
        for sign, side in (("pos", rows["advantage"] > 0), ("neg", rows["advantage"] < 0)):
            assert agg[f"k_{rule}_{sign}"].null_count() == 0  # every call evaluated every rule
            assert agg[f"k_{rule}_{sign}"].sum() == (rows[f"blocked_{rule}"] & side).sum()
            assert agg[f"tokens_{sign}"].sum() == side.sum()
    assert agg["tokens_zero"].sum() == (rows["advantage"] == 0).sum()
    mu = rows["mu_logp"].cast(pl.Float64).exp().to_numpy()
    assert agg["mu_decade_0"].sum() == (mu >= 0.1).sum()
    assert agg[[f"mu_decade_{i}" for i in range(7)]].sum_horizontal().sum() == rows.height
    log_rho = (rows["old_logp"].cast(pl.Float64) - rows["mu_logp"].cast(pl.Float64)).to_numpy()
    assert agg["sum_k3"].sum() == pytest.approx(float((np.exp(log_rho) - 1 - log_rho).sum()), rel=1e-12)
    assert agg["sum_topk_kl"].sum() == float("inf")
    # the top-K aggregates are of the token columns (μ vs π), over every token
    topk_tv = rows["topk_tv"].cast(pl.Float64)
    assert agg["topk_n"].sum() == rows.height and topk_tv.null_count() == 0
    assert agg["sum_topk_tv"].sum() / agg["topk_n"].sum() == pytest.approx(topk_tv.mean(), rel=1e-12)
    assert agg["max_topk_tv"].max() == topk_tv.max()
    entropy = rows["entropy"].drop_nulls()
    assert agg["entropy_n"].sum() == entropy.len() == (rows["update"] == 0).sum()
    assert agg["sum_entropy"].sum() == pytest.approx(entropy.cast(pl.Float64).sum(), rel=1e-12)


def test_exact_scalars_of_a_sampled_run_equal_the_full_runs(runs):
    exact = per_step_scalars(runs["sampled"].aggregates)
    truth = token_scalars(runs["full"].tokens).filter(~pl.col("name").is_in(list(SEQUENCE_LEVEL)))
    assert truth.height > 30
    for step, name, value in truth.rows():
        assert exact[step][name] == pytest.approx(value, rel=1e-9, abs=1e-12), (step, name)
    # the same names too: none only because the run was sampled. The top-K mismatch
    # (topk_tv_mean, ...: μ vs π_old) is not among them: the topk_ aggregates are μ vs π.
    for step, names in truth.group_by("step").agg("name").rows():
        assert set(exact[step]) == set(names), step
        assert not any(name.startswith("topk_") for name in exact[step])


def test_a_token_pi_old_gives_probability_0_counts_in_the_exact_mismatch(tmp_path):
    """log π_old = −inf is a value: the full rows' k1 and k3 of its step are +inf, and the
    aggregates of a sampled run give the same, not the mean over the other tokens."""
    full = record(tmp_path / "full", None, zero_old=(1, 0))
    sampled = record(tmp_path / "sampled", Keep(rate=0.05, seed=3), zero_old=(1, 0))
    exact = per_step_scalars(sampled.aggregates)
    truth = token_scalars(full.tokens).filter(~pl.col("name").is_in(list(SEQUENCE_LEVEL)))
    for step, name, value in truth.rows():
        assert exact[step][name] == pytest.approx(value, rel=1e-9, abs=1e-12), (step, name)
    at = {name: value for step, name, value in truth.rows() if step == 1}
    assert at["mismatch_kl"] == at["k3_kl"] == math.inf
    assert 0 < at["prob_diff_max"] < 1 and math.isfinite(at["prob_pearson"])
    pairs = sampled.aggregates.collect().group_by("step").agg(pl.col("pairs", "tokens").sum()).sort("step")
    assert pairs["pairs"].to_list() == pairs["tokens"].to_list()


def test_every_token_that_matters_is_kept_with_weight_one(runs):
    """Blocked by the active rule (ppo), rare or non-finite: kept, weight 1. A token only the
    counterfactual rules block is one of the random share (here all 3 such tokens dropped)."""
    keys = ["step", "update", "sample", "pos"]
    full = runs["full"].tokens.collect()
    low_mu = pl.col("mu_logp") < np.log(0.1)
    infinite = pl.col("topk_kl").is_infinite()
    matters = full.filter(pl.col("blocked_ppo") | low_mu | infinite).select(keys)
    kept = runs["sampled"].tokens.collect()
    joined = matters.join(kept, on=keys, how="left")
    assert matters.height > 0 and joined["weight"].null_count() == 0
    assert (joined["weight"] == 1).all()
    assert set(kept["weight"].unique().to_list()) == {1.0, 20.0}
    counterfactual = pl.col("blocked_dppo_binary_tv") | pl.col("blocked_dppo_topk_kl")
    others = full.filter(counterfactual & ~pl.col("blocked_ppo") & ~low_mu & ~infinite).select(keys)
    sampled = others.join(kept, on=keys, how="left")["weight"]
    assert sampled.len() == sampled.null_count() == 3


def test_weighted_rows_estimate_the_token_count(tmp_path):
    """Unbiased: Σ weight over kept rows estimates the number of tokens (here within 4 SE)."""
    keep = Keep(rate=0.2, seed=11, low_mu=1e-9, top_share=1e-6)
    run = record(tmp_path / "run", keep, seed=5)
    agg = run.aggregates.collect()
    kept = run.tokens.collect()
    random = kept.filter(pl.col("weight") > 1).height
    others = agg["tokens"].sum() - kept.filter(pl.col("weight") == 1).height
    assert kept["weight"].sum() == pytest.approx(agg["tokens"].sum(), abs=4 * np.sqrt(others * 0.8 / 0.2))
    assert 0 < random < others


def test_the_random_share_does_not_depend_on_batching():
    sample, pos = np.arange(100, dtype=np.int64), np.arange(100, dtype=np.int64) % 7
    whole = _uniform(4, 2, 1, 0, sample, pos)
    halves = np.concatenate([_uniform(4, 2, 1, 0, sample[:37], pos[:37]), _uniform(4, 2, 1, 0, sample[37:], pos[37:])])
    assert np.array_equal(whole, halves) and whole.min() >= 0 and whole.max() < 1
    assert not np.array_equal(whole, _uniform(5, 2, 1, 0, sample, pos))
    assert abs(_uniform(0, 0, 0, 0, np.arange(20_000), np.zeros(20_000, np.int64)).mean() - 0.5) < 0.01


def test_built_in_run_with_keep_rate(tmp_path):
    from trustlens.train.config import config_from_preset
    from trustlens.train.trainer import train

    for name, rate in (("full", None), ("sampled", 0.01)):
        train(config_from_preset("quick", eval_size=0, keep_rate=rate), tmp_path / name, progress=False)
    full, sampled = load_run(tmp_path / "full"), load_run(tmp_path / "sampled")
    assert sampled.manifest["keep"] == {"rate": 0.01, "seed": 0, "low_mu": 0.1, "top_share": 0.01, "rules": []}
    exact = per_step_scalars(sampled.aggregates)
    truth = token_scalars(full.tokens).filter(~pl.col("name").is_in(list(SEQUENCE_LEVEL)))
    for step, name, value in truth.rows():
        assert exact[step][name] == pytest.approx(value, rel=1e-9, abs=1e-12), (step, name)
    with pytest.raises(ValueError, match="keep_rate"):
        config_from_preset("quick", keep_rate=0.0)


def test_a_rule_a_call_could_not_decide_has_no_count(tmp_path):
    """Without π_old, π_old-anchored rules (minirl) are not evaluated: null counts, no rate."""
    g = torch.Generator().manual_seed(1)
    with TokenRecorder(tmp_path / "run", keep=Keep(rate=0.5)) as rec:
        mu = -torch.rand(4, 6, generator=g) - 0.05
        rec.record(
            0,
            token_ids=torch.zeros(4, 6, dtype=torch.long),
            response_mask=torch.ones(4, 6),
            pi_logp=(mu + 0.2).clamp(max=0),
            mu_logp=mu,
            advantages=torch.tensor([1.0, -1.0, 2.0, 0.0]),
        )
    agg = load_run(tmp_path / "run").aggregates.collect()
    assert agg["k_minirl_pos"].null_count() == 1 and agg["k_ppo_pos"].null_count() == 0
    scalars = per_step_scalars(agg)[0]
    assert "blocked/ppo/pos" in scalars and "blocked/minirl/pos" not in scalars
    assert scalars["zero_adv_frac"] == 0.25


def test_sampled_rows_store_no_derivable_columns_and_read_them_back(runs):
    """ratio, binary_tv and binary_kl are not stored in a sampled run; the reader computes them
    (the recorder's own function) bit for bit equal to what the full run stored."""
    import pyarrow.parquet as pq

    part = next((runs["all"].path / "tokens").glob("rank=0/part-*.parquet"))
    stored = pq.read_table(part, columns=["ratio", "binary_tv", "binary_kl"])
    assert all(stored.column(c).null_count == stored.num_rows for c in stored.column_names)
    keys = ["step", "update", "sample", "pos"]
    full = runs["full"].tokens.select(*keys, "ratio", "binary_tv", "binary_kl").collect()
    read = runs["all"].tokens.select(*keys, "ratio", "binary_tv", "binary_kl").collect()
    both = full.join(read, on=keys, suffix="_read")
    assert both.height == full.height
    for c in ("ratio", "binary_tv", "binary_kl"):
        assert both[f"{c}_read"].dtype == pl.Float32
        np.testing.assert_array_equal(both[c].to_numpy(), both[f"{c}_read"].to_numpy(), err_msg=c)


def test_mu_decades_are_closed_below():
    """Decade k holds μ in [10^-(k+1), 10^-k): μ = 1 and μ = 0.1 in decade 0 ([0.1, 1]), 0.01 in
    decade 1, 10⁻⁶ in decade 5, everything below 10⁻⁶ (and μ = 0) in the last; a NaN nowhere."""
    mu = [1.0, 0.5, 0.1, 0.0999, 0.01, 1e-6, 1e-9, 0.0]
    logp = np.array([math.log(m) if m else -math.inf for m in mu] + [math.nan])
    batch = SimpleNamespace(
        floats={"advantage": np.ones(len(logp), np.float32), "mu_logp": logp, "old_logp": logp, "pi_logp": logp},
        blocked={},
    )
    row = aggregate_row(batch, [])
    assert [row[f"mu_decade_{i}"] for i in range(7)] == [3, 2, 0, 0, 0, 1, 2]


def test_a_run_without_mu_keeps_and_buckets_by_pi_old(tmp_path):
    """Without μ the analyses anchor on π_old (analysis.tokens.anchor_column): every token with
    π_old < low_mu is kept with weight 1 and counted in π_old's decade, even where π is likely."""
    g = torch.Generator().manual_seed(0)
    rare = torch.zeros(4, 10, dtype=torch.bool)
    rare[:, ::3] = True  # 16 tokens rare under π_old (0.09) but not under π (0.11)
    old = torch.where(rare, math.log(0.09), math.log(0.5))
    pi = torch.where(rare, math.log(0.11), math.log(0.5))
    pi[:, 1] = math.log(0.9)  # 4 tokens with the largest |π − π_old|: the top share kept for that
    with TokenRecorder(tmp_path / "r", rules=["ppo"], keep=Keep(rate=1e-6)) as rec:
        rec.record(
            0,
            token_ids=torch.randint(0, 50, (4, 10), generator=g),
            response_mask=torch.ones(4, 10),
            pi_logp=pi,
            old_logp=old,
            advantages=torch.zeros(4),  # A = 0: no rule blocks, so only rarity and divergence keep a token
        )
    run = load_run(tmp_path / "r")
    kept = run.tokens.collect()
    assert (kept["old_logp"] < math.log(0.1)).sum() == 16 and (kept["weight"] == 1).all()
    assert kept.height == 20  # the 16 rare and the 4 moved tokens, not the 20 others
    agg = run.aggregates.collect()
    assert (agg["mu_decade_0"].item(), agg["mu_decade_1"].item()) == (24, 16)
