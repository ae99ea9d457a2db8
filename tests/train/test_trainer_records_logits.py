"""The built-in trainer records through `record(logits=…)` with μ's top-K, the path users take:
its runs carry the columns the recorder derives from π's logits (docs/doctor.md's logits forms)."""

import math

import polars as pl

import trustlens
from trustlens.train.config import config_from_preset
from trustlens.train.trainer import train


def test_a_trained_run_holds_the_logit_columns(tmp_path):
    cfg = config_from_preset(
        "default", steps=1, prompts_per_step=2, group_size=2, minibatches=1, eval_size=0, max_new_tokens=12
    )
    assert cfg.temperature != 1.0  # pi_logp_raw is recorded at τ ≠ 1
    train(cfg, tmp_path / "run", progress=False)
    rows = trustlens.load_run(tmp_path / "run").tokens.collect()
    for column in ("entropy", "topk_tv", "topk_kl", "pi_logp_raw", "mu_topk_mass", "pi_topk_mass"):
        assert rows[column].null_count() == 0, column
    assert rows.select((pl.col("mu_topk_mass").is_between(0, 1 + 1e-6)).all()).item()
    assert rows.select((pl.col("pi_topk_mass").is_between(0, 1 + 1e-6)).all()).item()
    # the sampled id is in μ's top-K: its mass is at least μ(a_t); π's raw and tempered log-probs differ
    assert rows.select((pl.col("mu_topk_mass") >= pl.col("mu_logp").exp() - 1e-5).all()).item()
    assert rows.select((pl.col("pi_logp_raw") - pl.col("pi_logp")).abs().max()).item() > 1e-3
    assert math.isfinite(rows["topk_tv"].max())
