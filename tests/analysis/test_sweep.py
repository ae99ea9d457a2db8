"""threshold_sweep: rules re-evaluated at scaled thresholds, checked on hand-worked tokens and
against the decisions a synthetic run recorded."""

import math

import polars as pl
import pytest

from trustlens.analysis.sweep import threshold_sweep
from trustlens.run import load_run
from trustlens.synthetic import write_synthetic_run

L = math.log

# (μ, π, A): worked by hand at ε = 0.1 / 0.2 / 0.4 (ppo) and δ = 0.075 / 0.15 / 0.3 (binary TV)
ROWS = [
    (0.01, 0.013, 1.0),  # ratio 1.3, TV 0.003: ppo blocks at ε 0.1 and 0.2; TV never
    (0.9, 0.7, -1.0),  # ratio 0.778, TV 0.2: ppo at 0.1 and 0.2; TV at 0.075 and 0.15
    (0.5, 0.6, -1.0),  # A ≤ 0 and π rose: the update brings it back, never blocked
    (0.5, 0.56, 1.0),  # ratio 1.12, TV 0.06: ppo at 0.1 only; TV never
]
SCALES = (0.5, 1.0, 2.0)


def table(rows=ROWS, **extra) -> pl.LazyFrame:
    mu, pi, adv = zip(*rows, strict=True)
    return pl.LazyFrame(
        {
            "step": [0] * len(rows),
            "mu_logp": [L(p) for p in mu],
            "pi_logp": [L(p) for p in pi],
            "advantage": list(adv),
            "blocked_ppo": [False] * len(rows),
            "blocked_dppo_binary_tv": [False] * len(rows),
            **extra,
        }
    )


def blocked(df: pl.DataFrame, rule: str, column: str = "blocked") -> list:
    return df.filter(pl.col("rule") == rule).sort("scale")[column].to_list()


def test_hand_worked_decisions():
    df = threshold_sweep(table(), scales=SCALES)
    assert df["rule"].unique(maintain_order=True).to_list() == ["ppo", "dppo_binary_tv"]
    assert blocked(df, "ppo") == [3, 2, 0]
    assert blocked(df, "dppo_binary_tv") == [1, 1, 0]
    assert blocked(df, "ppo", "low") == pytest.approx([0.1, 0.2, 0.4])
    assert blocked(df, "dppo_binary_tv", "high") == pytest.approx([0.075, 0.15, 0.3])
    assert set(df["count"]) == {4}
    # the A > 0 side is rows 0 and 3, the A ≤ 0 side rows 1 and 2
    assert blocked(df, "ppo", "blocked_frac_pos") == pytest.approx([1.0, 0.5, 0.0])
    assert blocked(df, "ppo", "blocked_frac_neg") == pytest.approx([0.5, 0.5, 0.0])
    assert blocked(df, "dppo_binary_tv", "blocked_frac") == pytest.approx([0.25, 0.25, 0.0])


def test_base_thresholds_are_scaled():
    df = threshold_sweep(table(), "ppo", scales=(1.0,), base={"ppo": {"low": 0.1, "high": 0.1}})
    assert df.row(0, named=True)["low"] == pytest.approx(0.1)
    assert df["blocked"].to_list() == [3]


def test_by_bucket_splits_the_totals():
    total = threshold_sweep(table(), scales=SCALES)
    split = threshold_sweep(table(), scales=SCALES, by_bucket=True, min_p=1e-3)
    assert split.columns[:8] == ["rule", "scale", "low", "high", "bucket", "p_lo", "p_hi", "label"]
    assert split["bucket"].n_unique() == 3  # [0, 1e-2), [1e-2, 1e-1), [0.1, 1]
    summed = split.group_by("rule", "scale", maintain_order=True).agg(pl.col("count", "blocked").sum())
    assert summed.select("count", "blocked").rows() == total.select("count", "blocked").rows()
    # ppo at ε = 0.1: the rare token (μ = 0.01, bucket [1e-2, 1e-1)) and two of the likely ones
    ppo = split.filter((pl.col("rule") == "ppo") & (pl.col("scale") == 0.5)).sort("bucket")
    assert ppo["blocked"].to_list() == [0, 1, 2]


def test_rows_without_a_rules_inputs_are_not_counted():
    old = [L(0.01), None, L(0.5), L(0.5)]
    df = threshold_sweep(table(old_logp=old), ["ppo", "minirl"], scales=(1.0,))
    assert dict(zip(df["rule"], df["count"], strict=True)) == {"ppo": 4, "minirl": 3}
    # minirl anchored on π_old: row 0 ratio 1.3 (blocked), rows 2 and 3 move less than 20%
    assert dict(zip(df["rule"], df["blocked"], strict=True)) == {"ppo": 2, "minirl": 1}


def test_batches_give_the_same_counts():
    rows = ROWS * 25
    assert threshold_sweep(table(rows), batch_rows=7).equals(threshold_sweep(table(rows)))


def test_scale_one_reproduces_the_recorded_decisions(tmp_path):
    rules = ["ppo", "minirl", "dppo_binary_tv", "dppo_binary_kl", "dppo_topk_tv", "pg_is"]
    run = load_run(
        write_synthetic_run(tmp_path / "run", steps=3, samples_per_step=16, seq_len=24, rules=rules, updates=2, seed=3)
    )
    df = threshold_sweep(run.tokens, scales=(1.0,), base=run.rules)
    assert df["rule"].to_list() == [r for r in rules if r != "pg_is"]  # pg_is never blocks
    recorded = run.tokens.select(pl.col(f"blocked_{r}").sum() for r in df["rule"]).collect().row(0)
    assert df["blocked"].to_list() == list(recorded)
    assert df["blocked"].sum() > 0


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"pg_is.*never blocks"):
        threshold_sweep(table(), "pg_is")
    with pytest.raises(ValueError, match=r"dppo_topk_tv.*topk_tv"):
        threshold_sweep(table(), "dppo_topk_tv")
    with pytest.raises(ValueError, match="scales"):
        threshold_sweep(table(), "ppo", scales=(1.0, -1.0))
    with pytest.raises(ValueError, match="scales"):
        threshold_sweep(table(), "ppo", scales=())
    with pytest.raises(KeyError, match="unknown rule"):
        threshold_sweep(table(), "nope")
    with pytest.raises(ValueError, match="batch_rows"):
        threshold_sweep(table(), batch_rows=0)


def test_zero_advantage_is_counted_apart():
    rows = [*ROWS, (0.01, 0.05, 0.0), (0.9, 0.1, 0.0)]  # far outside every region, but A = 0
    df = threshold_sweep(table(rows), scales=SCALES)
    assert set(df["count"]) == {4} and set(df["count_zero"]) == {2}
    assert blocked(df, "ppo") == [3, 2, 0]  # the A = 0 rows are never blocked


def test_custom_rule_from_the_manifest():
    custom = {"low": 0.1, "high": 0.1, "anchor": "mu", "measure": "binary_tv", "description": "tight TV"}
    df = threshold_sweep(table(blocked_tight=[False] * 4), ["tight"], scales=(1.0,), base={"tight": custom})
    # binary TV > 0.1 in the direction of the update: only row 1 (π fell by 0.2, A < 0)
    assert df["blocked"].to_list() == [1] and df["count"].to_list() == [4]


def test_sweep_needs_no_torch():
    import subprocess
    import sys

    code = "import sys, trustlens.analysis.sweep; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
