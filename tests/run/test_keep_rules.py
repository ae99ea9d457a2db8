"""Which blocked tokens a sampled run keeps (trustlens.run.aggregates, issue 46): those of the
active rule and of `Keep(rules=...)` at weight 1; the other rules' (counterfactual, sequence and
batch rules) at the sampling rate with weight 1/rate, counted exactly in the aggregates. On a
stale engine, where rs_geo blocks nearly every response, the rows kept stay a small share."""

import json
import math
import shutil

import numpy as np
import polars as pl
import pytest
import torch

from trustlens import Keep, TokenRecorder, load_run
from trustlens.analysis import step_summary
from trustlens.rules import RULES
from trustlens.rules.columns import evaluate_columns
from trustlens.run.aggregates import keep_mask
from trustlens.run.parts import TokenBatch

ACTIVE = "dppo_binary_tv"
KEYS = ["step", "update", "sample", "pos"]
SEQUENCE_RULES = [r.name for r in RULES.values() if r.level == "sequence"]


def feed_stale(rec, steps: int = 2, seed: int = 0) -> None:
    """A stale engine: log π_old − log μ drifts by 1–4% per token of a response, far beyond
    rs_geo's band of 1e-3 on the geometric mean (and beyond rs_seq's [0.5, 2] on the product of
    many), while π stays within a few 0.1% of π_old but at 3% of the tokens, where the trainer
    moved it by ×1.5 (the active rule's blocks). μ in [0.3, 0.95] (no token is rare) and no top-K:
    only the rules, the top divergences and the random share keep a token."""
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        mu = torch.empty(64, 32).uniform_(math.log(0.3), math.log(0.95), generator=g)
        drift = 0.01 * torch.randn(64, 1, generator=g).sign() * (1 + 3 * torch.rand(64, 1, generator=g))
        old = (mu + drift + 0.002 * torch.randn(64, 32, generator=g)).clamp(max=0)
        moved = torch.rand(64, 32, generator=g) < 0.03
        pi = (old + 0.003 * torch.randn(64, 32, generator=g) + math.log(1.5) * moved).clamp(max=0)
        rec.record(
            step,
            token_ids=torch.randint(0, 50, (64, 32), generator=g),
            response_mask=torch.ones(64, 32, dtype=torch.bool),
            pi_logp=pi,
            mu_logp=mu,
            old_logp=old,
            advantages=torch.randn(64, generator=g).sign(),
        )


def record(path, keep: Keep | None, **kwargs):
    with TokenRecorder(path, active_rule=ACTIVE, keep=keep, **kwargs) as rec:  # all 22 rules
        feed_stale(rec)
    return load_run(path)


@pytest.fixture(scope="module")
def stale(tmp_path_factory):
    root = tmp_path_factory.mktemp("stale")
    return {
        "full": record(root / "full", None),
        "sampled": record(root / "sampled", Keep(rate=0.05, seed=2)),
        "rs_geo": record(root / "rs_geo", Keep(rate=0.05, seed=2, rules=["rs_geo"])),
    }


def test_the_stale_engine_blocks_most_tokens_by_rs_geo(stale):
    rows = stale["full"].tokens.collect()
    assert len(RULES) == 22 and set(stale["full"].rules) == set(RULES)
    assert rows["blocked_rs_geo"].mean() > 0.9
    assert rows["blocked_rs_seq"].mean() > 0.3 and rows["blocked_gspo"].mean() > 0.3
    assert 0.015 < rows[f"blocked_{ACTIVE}"].mean() < 0.04


def test_a_sampled_run_keeps_few_rows_though_sequence_rules_block_most(stale):
    """Regression (bea0ccc kept every token any rule blocks: > 90% here)."""
    total = stale["full"].tokens.select(pl.len()).collect().item()
    kept = stale["sampled"].tokens.collect()
    assert kept.height / total < 0.1  # the rate 0.05, the top share 0.01, the active rule's blocks
    agg = stale["sampled"].aggregates.collect()
    full = stale["full"].tokens.collect()
    for rule in ("rs_geo", "rs_seq", "gspo", "clip_cov", ACTIVE):  # still counted exactly
        for sign, side in (("pos", full["advantage"] > 0), ("neg", full["advantage"] < 0)):
            assert agg[f"k_{rule}_{sign}"].sum() == (full[f"blocked_{rule}"] & side).sum(), (rule, sign)


def test_the_active_rule_and_keep_rules_keep_their_blocked_tokens_at_weight_one(stale):
    full = stale["full"].tokens.collect()
    for run, rules in ((stale["sampled"], [ACTIVE]), (stale["rs_geo"], [ACTIVE, "rs_geo"])):
        kept = run.tokens.collect()
        for rule in rules:
            blocked = full.filter(pl.col(f"blocked_{rule}")).select(KEYS)
            weights = blocked.join(kept, on=KEYS, how="left")["weight"]
            assert blocked.height > 0 and weights.null_count() == 0 and (weights == 1).all(), rule
    assert stale["rs_geo"].tokens.select(pl.len()).collect().item() > 0.9 * full.height
    # not in the set: rs_geo's blocked tokens are drawn at the rate
    kept = stale["sampled"].tokens.filter(pl.col("blocked_rs_geo")).collect()
    assert set(kept["weight"].unique().to_list()) == {1.0, 20.0}


@pytest.mark.parametrize("rule", ["rs_geo", "rs_seq", "gspo", "dppo_binary_tv_recompute"])
def test_weighted_kept_rows_estimate_a_counterfactual_rules_exact_count(stale, rule):
    """Σ weight over the kept rows a rule blocks is unbiased for the rule's exact count: within
    4 standard errors, SE² = m (1 − rate) / rate over the m of them drawn at random."""
    kept = stale["sampled"].tokens.filter(pl.col(f"blocked_{rule}")).collect()
    exact = stale["sampled"].aggregates.select(pl.col(f"k_{rule}_pos") + pl.col(f"k_{rule}_neg")).collect()
    exact = int(exact.to_series().sum())
    at_one = int((kept["weight"] == 1).sum())
    se = math.sqrt((exact - at_one) * 0.95 / 0.05)
    assert kept["weight"].sum() == pytest.approx(exact, abs=4 * se + 1e-9)


def test_the_expected_weight_of_every_token_is_one():
    """Over 400 seeds the mean of Σ weight over the tokens a counterfactual rule blocks is its
    count (the random share's expectation rate · 1/rate = 1 per token), within 4 SE of the mean."""
    n, rate = 4000, 0.1
    rng = np.random.default_rng(0)
    batch = TokenBatch(
        step=3,
        update=0,
        sample=np.repeat(np.arange(100, dtype=np.int64), 40),
        group=np.zeros(n, np.int64),
        pos=np.tile(np.arange(40, dtype=np.int64), 100),
        token_id=np.zeros(n, np.int64),
        floats={"mu_logp": np.log(rng.uniform(0.3, 1.0, n)), "binary_tv": rng.uniform(0, 0.1, n), "topk_tv": None},
        blocked={"ppo": rng.random(n) < 0.05, "rs_geo": rng.random(n) < 0.9},
    )
    totals = []
    for seed in range(400):
        kept, weight = keep_mask(batch, Keep(rate=rate, seed=seed), 0, "ppo")
        totals.append(float(weight[kept & batch.blocked["rs_geo"]].astype(np.float64).sum()))
    drawn = batch.blocked["rs_geo"] & ~batch.blocked["ppo"]  # at most these are drawn at random
    se = math.sqrt(drawn.sum() * (1 - rate) / rate / len(totals))
    assert np.mean(totals) == pytest.approx(batch.blocked["rs_geo"].sum(), abs=4 * se)


def test_sequence_rules_are_decided_again_exactly_on_the_kept_rows(stale):
    """Each kept row carries its whole response's statistics, so the sequence rules decided on
    the kept rows alone agree with the recorder's decision on every row."""
    kept = stale["sampled"].tokens.collect()
    again = evaluate_columns(SEQUENCE_RULES, kept)
    for rule in SEQUENCE_RULES:
        assert again[rule].null_count() == 0
        assert again[rule].equals(kept[f"blocked_{rule}"].alias(rule)), rule


def test_run_json_records_keep_rules_and_an_older_run_without_them_reads(stale, tmp_path):
    assert stale["rs_geo"].manifest["keep"] == {
        "rate": 0.05,
        "seed": 2,
        "low_mu": 0.1,
        "top_share": 0.01,
        "rules": ["rs_geo"],
    }
    assert stale["sampled"].manifest["keep"]["rules"] == []

    old = tmp_path / "old"
    shutil.copytree(stale["sampled"].path, old)
    manifest = json.loads((old / "run.json").read_text())
    del manifest["keep"]["rules"]  # as written before Keep had rules
    (old / "run.json").write_text(json.dumps(manifest))
    run = load_run(old)
    assert run.sampled and "rules" not in run.manifest["keep"]
    assert step_summary(run.tokens)["tokens"].sum() > 0


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ("rs_geo", r"Keep.rules must be a list of rule names, e.g. \['ppo', 'rs_geo'\], got 'rs_geo'"),
        (["rs_gep"], r"Keep.rules: unknown rule 'rs_gep'.*rs_geo.*known rules: ppo, "),
        ([3], r"Keep.rules: unknown rule 3; known rules"),
        ({"ppo": 1}, r"Keep.rules must be a list of rule names"),
    ],
)
def test_bad_keep_rules_are_refused_naming_the_rule(rules, message):
    with pytest.raises(ValueError, match=message):
        Keep(rules=rules)


def test_keep_rules_the_run_does_not_evaluate_are_refused(tmp_path):
    with pytest.raises(
        ValueError, match=r"Keep.rules \['rs_geo'\] are not among the rules the run evaluates \['ppo'\]"
    ):
        TokenRecorder(tmp_path / "run", rules=["ppo"], keep=Keep(rules=["rs_geo"]))
    assert not (tmp_path / "run" / "run.json").exists()


def test_keep_rules_take_rules_and_drop_repeats():
    assert Keep(rules=["rs_geo", RULES["ppo"], "rs_geo"]).rules == ("rs_geo", "ppo")
    assert Keep(rules=("gspo",)) == Keep(rules=["gspo"])  # a tuple either way: hashable, comparable
