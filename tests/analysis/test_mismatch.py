import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from trustlens import Keep
from trustlens.analysis import (
    MISMATCH_COLUMNS,
    exact_aggregates,
    mismatch_by_bucket,
    mismatch_by_staleness,
    mismatch_per_step,
    mismatch_unavailable,
)
from trustlens.analysis.mismatch import SEQUENCE_LEVEL, logged_per_step, token_mismatch, with_logged_sequence_level
from trustlens.export.scalars import step_scalars
from trustlens.run import load_run
from trustlens.run.tables import write_run
from trustlens.synthetic import write_synthetic_run

L = math.log
SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample_run"


def test_per_step_by_hand(mismatch_run):
    df = mismatch_per_step(mismatch_run.tokens)
    assert df.columns == ["step", *MISMATCH_COLUMNS]
    s0, s1 = df.iter_rows(named=True)
    # step 0: ρ = π_old/μ = 0.5, 1, 2 over samples {0: (0.5, 1), 1: (2,)}
    assert s0["tokens"] == 3
    assert s0["mismatch_kl"] == pytest.approx(0.0, abs=1e-7)
    assert s0["k3_kl"] == pytest.approx(((0.5 - 1 - L(0.5)) + 0 + (2 - 1 - L(2))) / 3, rel=1e-6)
    assert s0["chi2_token"] == pytest.approx((0.25 + 1 + 4) / 3 - 1, rel=1e-6)
    assert s0["log_ppl_diff"] == pytest.approx(((-L(0.5)) / 2 + (-L(2))) / 2, rel=1e-6)
    assert s0["log_ppl_abs_diff"] == pytest.approx((L(2) / 2 + L(2)) / 2, rel=1e-6)
    assert s0["chi2_seq"] == pytest.approx(((0.25 - 1) + (4 - 1)) / 2, rel=1e-6)
    assert s0["prob_diff_mean"] == pytest.approx((0.25 + 0 + 0.125) / 3, rel=1e-6)
    assert s0["prob_diff_max"] == pytest.approx(0.25, rel=1e-6)
    assert s0["prob_pearson"] == pytest.approx(np.corrcoef([0.5, 0.8, 0.125], [0.25, 0.8, 0.25])[0, 1], rel=1e-6)
    # step 1: only the first-update row without π_old counts, with π (0.5) standing in for π_old
    assert s1["tokens"] == 1
    assert s1["mismatch_kl"] == pytest.approx(L(0.4 / 0.5), rel=1e-6)
    assert s1["k3_kl"] == pytest.approx(1.25 - 1 - L(1.25), rel=1e-5)
    assert s1["prob_pearson"] is None  # one token: no correlation


@pytest.mark.parametrize("weights", [False, True])
def test_token_mismatch_aggregates_the_rows_as_mismatch_per_step_does(mismatch_run, weights):
    tokens = mismatch_run.tokens.with_columns(pl.lit(None, pl.Float32).alias("weight"))  # weight 1 per row
    one_pass = tokens.group_by("step").agg(token_mismatch(weights=weights)).sort("step").collect()
    per_step = mismatch_per_step(mismatch_run.tokens)
    assert one_pass["k3_kl"].to_list() == pytest.approx(per_step["k3_kl"].to_list(), rel=1e-12)
    assert one_pass["prob_diff_mean"].to_list() == pytest.approx(per_step["prob_diff_mean"].to_list(), rel=1e-12)
    # by hand (test_per_step_by_hand): step 1's only pair is the first-update row, π standing in for π_old
    assert one_pass["k3_kl"][1] == pytest.approx(1.25 - 1 - L(1.25), rel=1e-6)


def test_token_mismatch_weighs_sampled_rows():
    # two pairs: ρ = 2 kept with weight 1, ρ = 1 (k3 = 0, |Δp| = 0) standing for 3 tokens
    rows = pl.DataFrame(
        {
            "update": [0, 0],
            "mu_logp": [L(0.25), L(0.5)],
            "old_logp": [L(0.5), L(0.5)],
            "pi_logp": [None, None],
            "weight": [1.0, 3.0],
        }
    )
    k3, dp = rows.select(token_mismatch(weights=True)).row(0)
    assert k3 == pytest.approx((2 - 1 - L(2)) / 4, rel=1e-12)
    assert dp == pytest.approx(0.25 / 4, rel=1e-12)


def test_by_bucket_by_hand(mismatch_run):
    df = mismatch_by_bucket(mismatch_run.tokens)
    assert df["tokens"].to_list() == [0, 0, 0, 0, 0, 4]  # μ = 0.125 … 0.8 are all in [0.1, 1]
    top = df.row(5, named=True)
    assert top["k3_kl"] == pytest.approx(((0.5 - 1 - L(0.5)) + (2 - 1 - L(2)) + (1.25 - 1 - L(1.25))) / 4, rel=1e-5)
    assert df.row(0, named=True)["k3_kl"] is None


def test_without_mu_says_why(tmp_path):
    run = load_run(
        write_synthetic_run(tmp_path / "r", steps=2, samples_per_step=8, seq_len=4, rules=["ppo"], with_mu=False)
    )
    reason = mismatch_unavailable(run.tokens)
    assert "without the rollout engine's log-probabilities" in reason
    df = mismatch_per_step(run.tokens)
    assert df.is_empty() and df.columns == ["step", *MISMATCH_COLUMNS]
    assert mismatch_by_bucket(run.tokens).is_empty()


def test_empty_and_unpaired(tmp_path, mismatch_run):
    assert mismatch_unavailable(mismatch_run.tokens.filter(pl.lit(False))) == "the run has no token rows yet"
    assert mismatch_per_step(mismatch_run.tokens.filter(pl.lit(False))).is_empty()
    run = load_run(
        write_run(
            tmp_path / "r",
            tokens={"step": [0], "update": [1], "sample": [0], "pos": [0], "mu_logp": [-1.0], "pi_logp": [-1.0]},
        )
    )
    assert "no row has both" in mismatch_unavailable(run.tokens)
    assert mismatch_unavailable(mismatch_run.tokens) is None


def test_synthetic_collapse_grows_mismatch(tmp_path):
    run = load_run(
        write_synthetic_run(tmp_path / "r", steps=10, samples_per_step=16, seq_len=16, rules=[], collapse_at=6)
    )
    df = mismatch_per_step(run.tokens)
    assert df.filter(pl.col("step") >= 8)["k3_kl"].min() > 10 * df.filter(pl.col("step") < 6)["k3_kl"].median()
    assert (df["k3_kl"] >= 0).all()


def test_only_chi2_is_clamped_as_in_verl(tmp_path):
    """verl's compute_offpolicy_metrics clamps log ρ only for χ²; kl and k3_kl use it as it is."""
    mu, old = [-35.0, -1.0], [-5.0, -1.0]  # log ρ = 30 on the first token, 0 on the second
    tokens = {
        "step": [0, 0],
        "update": [0, 0],
        "sample": [0, 0],
        "pos": [0, 1],
        "mu_logp": mu,
        "old_logp": old,
        "pi_logp": old,
    }
    s = mismatch_per_step(load_run(write_run(tmp_path / "r", tokens=tokens)).tokens).row(0, named=True)
    assert s["k3_kl"] == pytest.approx((math.exp(30) - 1 - 30) / 2, rel=1e-9)  # not e^20 − 21
    assert s["mismatch_kl"] == pytest.approx(-30 / 2)
    assert s["chi2_token"] == pytest.approx((math.exp(40) + 1) / 2 - 1, rel=1e-9)  # log ρ clamped to 20
    assert s["chi2_seq"] == pytest.approx(math.exp(40) - 1, rel=1e-9)  # Σ log ρ = 30 clamped to 20


def test_zero_trainer_probability_gives_inf(tmp_path):
    tokens = {
        "step": [0],
        "update": [0],
        "sample": [0],
        "pos": [0],
        "mu_logp": [-0.1],
        "old_logp": [-math.inf],
        "pi_logp": [-1.0],
    }
    s = mismatch_per_step(load_run(write_run(tmp_path / "r", tokens=tokens)).tokens).row(0, named=True)
    assert s["mismatch_kl"] == math.inf and s["k3_kl"] == math.inf and s["log_ppl_diff"] == math.inf
    assert s["chi2_token"] == pytest.approx(math.exp(-40) - 1)


def test_columns_are_registry_names():
    from trustlens.metrics import METRICS, MISMATCH_METRICS

    assert list(MISMATCH_COLUMNS) == ["tokens", *MISMATCH_METRICS]
    assert all(name in METRICS for name in MISMATCH_METRICS)


# Two responses of 3 tokens, (μ, π_old) per token: mean_t(log μ − log π_old) is 2·log 2/3 for
# the first and −log 2/3 for the second; Σ_t log ρ_t is −2·log 2 and log 2.
MU = [[0.5, 0.8, 0.4], [0.25, 0.5, 0.9]]
OLD = [[0.25, 0.8, 0.2], [0.5, 0.5, 0.9]]
LOG_PPL_DIFF = (2 * L(2) / 3 - L(2) / 3) / 2  # = log 2 / 6
LOG_PPL_ABS_DIFF = (2 * L(2) / 3 + L(2) / 3) / 2  # = log 2 / 2
CHI2_SEQ = ((1 / 16 - 1) + (4 - 1)) / 2  # (Π ρ)² − 1 = 2^-4 − 1 and 2² − 1


def test_sampled_rows_give_no_sequence_level_value_and_the_logged_one_fills_it(tmp_path):
    """Step 0's rows are a sample (weights): its sequence-level metrics are null, then the run's
    logged log_ppl_diff (mean over ranks); step 1 recorded every token and keeps its own."""
    rows = [  # (step, sample, pos, μ, π_old, weight)
        (0, 0, 0, 0.5, 0.25, 1.0),  # kept because it matters
        (0, 0, 1, 0.8, 0.8, 20.0),  # one of the random share, at rate 0.05
        (0, 1, 0, 0.125, 0.25, 1.0),
        *((1, 2 + b, t, MU[b][t], OLD[b][t], None) for b in range(2) for t in range(3)),
    ]
    step, sample, pos, mu, old, weight = (list(c) for c in zip(*rows, strict=True))
    tokens = {
        "step": step,
        "sample": sample,
        "pos": pos,
        "mu_logp": [L(p) for p in mu],
        "old_logp": [L(p) for p in old],
        "pi_logp": [L(p) for p in old],
        "weight": weight,
    }
    metrics = {  # as a trainer of two ranks logs them; step 1's differs from its tokens' on purpose
        "step": [0, 0, 1, 0],
        "rank": [0, 1, 0, 0],
        "name": ["log_ppl_diff", "log_ppl_diff", "log_ppl_diff", "reward/mean"],
        "value": [0.01, 0.04, 0.5, 1.0],
    }
    run = load_run(write_run(tmp_path / "r", tokens=tokens, metrics=metrics))
    df = mismatch_per_step(run.tokens)
    s0, s1 = df.iter_rows(named=True)
    assert (s0["log_ppl_diff"], s0["log_ppl_abs_diff"], s0["chi2_seq"]) == (None, None, None)
    # the token-level ones are weighted estimates: Σ w·x / Σ w over 22 tokens' worth of rows
    assert s0["tokens"] == 22
    assert s0["mismatch_kl"] == pytest.approx((L(2) + 0 - L(2)) / 22, abs=1e-7)
    assert s0["k3_kl"] == pytest.approx(((0.5 - 1 - L(0.5)) + (2 - 1 - L(2))) / 22, rel=1e-6)
    assert s1["log_ppl_diff"] == pytest.approx(LOG_PPL_DIFF, rel=1e-6)
    assert s1["log_ppl_abs_diff"] == pytest.approx(LOG_PPL_ABS_DIFF, rel=1e-6)
    assert s1["chi2_seq"] == pytest.approx(CHI2_SEQ, rel=1e-6)

    assert logged_per_step(run.metrics).rows() == [
        (0, "log_ppl_diff", pytest.approx(0.025)),
        (0, "reward/mean", 1.0),
        (1, "log_ppl_diff", 0.5),
    ]
    filled = with_logged_sequence_level(df, run.metrics)
    assert filled.columns == df.columns
    f0, f1 = filled.iter_rows(named=True)
    assert f0["log_ppl_diff"] == pytest.approx(0.025)  # (0.01 + 0.04) / 2: the mean over ranks
    assert (f0["log_ppl_abs_diff"], f0["chi2_seq"]) == (None, None)  # not logged: no number
    assert f1 == s1  # computed from every token: the logged 0.5 does not replace it
    assert filled.drop(SEQUENCE_LEVEL).equals(df.drop(SEQUENCE_LEVEL))


def _recorded(path, keep, logged: float):
    """One step of the two responses above, recorded with `keep`; the run logs `logged` as its
    log_ppl_diff. A = 0 and μ ≥ 0.1: no token is kept for being blocked or rare."""
    import torch

    from trustlens import TokenRecorder

    mu, old = torch.tensor(MU).log(), torch.tensor(OLD).log()
    with TokenRecorder(path, rules=["ppo"], keep=keep) as rec:
        rec.record(
            0,
            token_ids=torch.zeros(2, 3, dtype=torch.long),
            response_mask=torch.ones(2, 3),
            pi_logp=old,
            mu_logp=mu,
            old_logp=old,
            advantages=torch.zeros(2),
        )
        rec.log_metrics(0, {"log_ppl_diff": logged})
    return load_run(path)


def test_a_sampled_step_takes_its_sequence_level_metrics_from_the_logged_ones(tmp_path):
    run = _recorded(tmp_path / "sampled", Keep(rate=1e-6), logged=0.125)
    assert run.sampled and run.tokens.collect().height < 6
    got = mismatch_per_step(run.tokens, aggregates=exact_aggregates(run))
    assert got["tokens"].to_list() == [6]  # exact, from the aggregates
    assert got["mismatch_kl"].item() == pytest.approx((2 * L(2) - L(2)) / 6, rel=1e-6)
    assert got.select(SEQUENCE_LEVEL).row(0) == (None, None, None)
    shown = with_logged_sequence_level(got, run.metrics).row(0, named=True)
    assert (shown["log_ppl_diff"], shown["log_ppl_abs_diff"], shown["chi2_seq"]) == (0.125, None, None)


def test_a_step_that_kept_every_token_keeps_its_exact_sequence_level_metrics(tmp_path):
    run = _recorded(tmp_path / "all", Keep(rate=1.0), logged=0.125)
    assert run.sampled and run.tokens.collect().height == 6
    got = mismatch_per_step(run.tokens, aggregates=exact_aggregates(run))
    assert got["log_ppl_diff"].item() == pytest.approx(LOG_PPL_DIFF, rel=1e-6)
    assert got["log_ppl_abs_diff"].item() == pytest.approx(LOG_PPL_ABS_DIFF, rel=1e-6)
    assert got["chi2_seq"].item() == pytest.approx(CHI2_SEQ, rel=1e-6)
    assert with_logged_sequence_level(got, run.metrics).equals(got)
    # without the aggregates nothing shows that every token was kept: no value, rather than a guess
    assert mismatch_per_step(run.tokens).select(SEQUENCE_LEVEL).row(0) == (None, None, None)


@pytest.mark.parametrize("name", ["ppo", "pg_is"])
def test_the_sample_runs_show_the_trainers_log_ppl_diff_as_export_sends_it(name):
    """The shipped sample is recorded with Keep(rate=0.03): the kept rows' mean of log_ppl_diff
    was ~8× the trainer's. The dashboard's per-step values (mismatch_per_step with the aggregates,
    then with_logged_sequence_level) are now the trainer's, exactly what `trustlens export`
    sends; the sequence-level metrics the trainer did not log are null and not exported."""
    run = load_run(SAMPLE / name)
    shown = with_logged_sequence_level(mismatch_per_step(run.tokens, aggregates=exact_aggregates(run)), run.metrics)
    trainer = run.metrics.filter(pl.col("name") == "log_ppl_diff").select("step", "value").collect().sort("step")
    assert shown["step"].to_list() == trainer["step"].to_list() == list(range(250))
    assert shown["log_ppl_diff"].to_list() == trainer["value"].to_list()
    assert shown["log_ppl_abs_diff"].is_null().all() and shown["chi2_seq"].is_null().all()
    assert shown["log_ppl_diff"].mean() == pytest.approx({"ppo": 0.04905, "pg_is": 0.20841}[name], abs=1e-5)
    exported = step_scalars(run).filter(pl.col("name").is_in(SEQUENCE_LEVEL))
    assert exported["name"].unique().to_list() == ["log_ppl_diff"]
    assert exported["value"].to_list() == shown["log_ppl_diff"].to_list()


def test_mismatch_by_staleness_by_hand(tmp_path):
    # 3 fresh tokens with ρ = π_old/μ = 1, 2 tokens 2 updates stale with ρ = 2: k3 = ρ − 1 − log ρ
    mu = [math.log(0.5)] * 3 + [math.log(0.2)] * 2
    old = [math.log(0.5)] * 3 + [math.log(0.4)] * 2
    tokens = {"step": [0] * 5, "sample": list(range(5)), "pos": [0] * 5, "mu_logp": mu, "old_logp": old}
    path = write_run(tmp_path / "r", tokens={**tokens, "pi_logp": old, "staleness": [0.0] * 3 + [2.0] * 2}, rules=[])
    df = mismatch_by_staleness(load_run(path))
    assert df["staleness"].to_list() == [0.0, 2.0] and df["tokens"].to_list() == [3, 2]
    assert df["k3_kl"].to_list() == pytest.approx([0.0, 2 - 1 - math.log(2)], abs=1e-6)
    assert df["prob_diff_mean"].to_list() == pytest.approx([0.0, 0.2], abs=1e-6)
    bare = write_run(tmp_path / "b", tokens={**tokens, "pi_logp": old}, rules=[])
    assert mismatch_by_staleness(load_run(bare)).is_empty()
