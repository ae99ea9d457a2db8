import math

import polars as pl
import pytest
import torch

import trustlens
from trustlens.rules import RULES
from trustlens.train.config import PRESETS, TrainConfig, config_from_preset
from trustlens.train.model import ModelConfig, build_model, build_tokenizer
from trustlens.train.pooled import local_values, log_reduced, ratio
from trustlens.train.rollout import Rollout, RolloutConfig, RolloutEngine, response_logits
from trustlens.train.trainer import BlockedCounter, group_advantages, mismatch_metrics, token_logp, train
from trustlens.train.world import World


def test_group_advantages_closed_form():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_advantages(rewards, group_size=4)
    s = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1)
    expected = torch.tensor([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0, 0, 0, 0])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        group_advantages(rewards, 4, scale=False), torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])
    )


def test_token_logp_against_float64(gen):
    logits = torch.randn(3, 5, 40, generator=gen) * 3
    ids = torch.randint(0, 40, (3, 5), generator=gen)
    ref = torch.log_softmax(logits.double(), -1)
    torch.testing.assert_close(
        token_logp(logits, ids).double(), ref.gather(-1, ids[..., None]).squeeze(-1), atol=1e-5, rtol=0
    )


def _rollout(mu_logp, mask, topk_ids, topk_logp):
    B, T = mu_logp.shape
    return Rollout(
        input_ids=torch.zeros(B, T + 1, dtype=torch.long),
        attention_mask=torch.ones(B, T + 1, dtype=torch.long),
        prompt_len=1,
        response_ids=torch.zeros(B, T, dtype=torch.long),
        response_mask=mask,
        mu_logp=mu_logp,
        mu_topk_ids=topk_ids,
        mu_topk_logp=topk_logp,
    )


def test_mismatch_metrics_hand_case():
    # V = 3, one response of 2 tokens (the third position is padding); π_old uniform
    old_logits = torch.zeros(1, 3, 3)
    old_logp = torch.full((1, 3), -math.log(3))
    mu_probs = torch.tensor([[0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3], [0.9, 0.05, 0.05]])
    ids = torch.tensor([[[0, 1], [0, 1], [0, 1]]])  # K = 2, sampled token 0
    batch = _rollout(mu_probs[:, 0].log()[None], torch.tensor([[True, True, False]]), ids, mu_probs[:, :2].log()[None])
    m = local_values(mismatch_metrics(batch, old_logits, old_logp))
    # token 1: μ(a) = 0.5 vs 1/3; token 2: equal
    assert m["mismatch_kl"] == pytest.approx((math.log(0.5) - math.log(1 / 3)) / 2, abs=1e-6)
    assert m["log_ppl_diff"] == pytest.approx(m["mismatch_kl"], abs=1e-6)
    rho = (1 / 3) / 0.5  # π_old / μ at token 1; token 2 has ρ = 1, k3 = 0
    assert m["k3_kl"] == pytest.approx((rho - 1 - math.log(rho)) / 2, abs=1e-6)
    tv1 = 0.5 * (abs(0.5 - 1 / 3) + abs(0.25 - 1 / 3) + abs(0.25 - 1 / 3))
    kl1 = 0.5 * math.log(1.5) + 2 * 0.25 * math.log(0.75)
    assert m["topk_tv_mean"] == pytest.approx(tv1 / 2, abs=1e-6)
    assert m["topk_tv_max"] == pytest.approx(tv1, abs=1e-6)
    assert m["topk_kl_mean"] == pytest.approx(kl1 / 2, abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_trainer_and_fp32_engine_agree_at_the_same_weights(temperature):
    """π_old (trainer, logits / τ) equals μ (fp32 engine at τ): no false mismatch (DESIGN §1)."""
    tok = build_tokenizer()
    model = build_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), seed=0)
    engine = RolloutEngine(
        model,
        RolloutConfig(temperature=temperature, max_new_tokens=6, precision="fp32"),
        eos_id=tok.eos_token_id,
        pad_id=tok.pad_token_id,
    )
    batch = engine.generate(
        [tok("1 + 2 =").input_ids, tok("10 + 20 + 30 =").input_ids] * 3, generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        logits = response_logits(model, batch, temperature)
    m = local_values(mismatch_metrics(batch, logits, token_logp(logits, batch.response_ids)))
    assert abs(m["mismatch_kl"]) < 1e-5 and m["topk_tv_max"] < 1e-5 and m["k3_kl"] < 1e-9


def test_blocked_counter_splits_by_advantage_sign():
    counter = BlockedCounter(["a", "b"])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([[1.0], [-1.0]])
    counter.add(
        {"a": torch.tensor([[True, False, True], [True, True, True]]), "b": torch.zeros(2, 3, dtype=torch.bool)},
        adv,
        mask,
    )
    out = counter.metrics()
    assert local_values(out) == {"blocked/a/pos": 0.5, "blocked/a/neg": 1.0, "blocked/b/pos": 0.0, "blocked/b/neg": 0.0}
    assert out["blocked/a/pos"].sums == (1.0, 2.0) and out["blocked/a/neg"].sums == (3.0, 3.0)  # pooled over ranks
    assert math.isnan(BlockedCounter(["a"]).metrics()["blocked/a/pos"].value)


def test_log_in_one_process_is_the_identity():
    logged = {}

    class Sink:
        def log_metrics(self, step, metrics):
            logged[step] = metrics

    out = log_reduced(Sink(), World(0, 1), 3, {"x": 1.5, "y_max": 2.0, "z": math.nan})
    assert logged[3] == out and out["x"] == 1.5 and out["y_max"] == 2.0 and math.isnan(out["z"])
    # a ratio is its own value; +inf is a value and stays one (docs/metrics.md)
    out = log_reduced(Sink(), World(0, 1), 5, {"r": ratio(1, 4), "kl": ratio(math.inf, 3), "kl_max": math.inf})
    assert out == {"kl": math.inf, "kl_max": math.inf, "r": 0.25} == logged[5]
    assert log_reduced(Sink(), World(0, 1), 4, {}) == {} and 4 not in logged


def test_config_presets_and_validation():
    assert config_from_preset("quick", steps=5, lr=None).steps == 5
    assert config_from_preset("quick").group_size == PRESETS["quick"]["group_size"]
    with pytest.raises(ValueError, match="unknown preset"):
        config_from_preset("huge")
    with pytest.raises(ValueError, match="unknown TrainConfig fields"):
        config_from_preset("default", stepz=3)
    with pytest.raises(KeyError, match="unknown rule"):
        TrainConfig(rule="ppo2")
    with pytest.raises(ValueError, match="minibatches must be ≥ 1"):
        TrainConfig(minibatches=0)
    with pytest.raises(ValueError, match=r"tv_bound must be a number in \(0, 1\), got 0.0"):
        TrainConfig(tv_bound=0.0)


def test_tv_bound_sets_every_tv_rule_where_low_and_high_give_none():
    cfg = config_from_preset("collapse", rule="dppo_binary_tv", high=0.2)
    assert cfg.tv_bound == 0.1
    rules = cfg.rule_thresholds()
    assert rules["dppo_binary_tv"] == (0.1, 0.2)  # the active rule: high given, low from tv_bound
    assert rules["dppo_topk_tv"] == rules["dppo_binary_tv_recompute"] == (0.1, 0.1)
    assert rules["ppo"] == rules["dppo_binary_kl"] == rules["pg_is"] == (None, None)  # not TV-bounded
    assert config_from_preset("default").rule_thresholds()["dppo_binary_tv"] == (None, None)


def test_tv_bound_is_what_the_run_evaluates(tmp_path):
    train(config_from_preset("quick", rule="ppo", tv_bound=0.1), tmp_path / "run", progress=False)
    rules = trustlens.load_run(tmp_path / "run").manifest["rules"]
    assert (rules["dppo_binary_tv"]["low"], rules["dppo_binary_tv"]["high"]) == (0.1, 0.1)
    assert (rules["ppo"]["low"], rules["ppo"]["high"]) == (0.2, 0.2)


def test_few_step_run_records_mu_old_and_pi(tmp_path):
    cfg = config_from_preset("quick", checkpoint=None, rule="ppo", seed=1)
    result = train(cfg, tmp_path / "run", progress=False)
    run = trustlens.load_run(tmp_path / "run")
    assert run.manifest["status"] == "finished" and run.manifest["active_rule"] == "ppo"
    assert run.manifest["config"]["steps"] == cfg.steps
    tokens = run.tokens.collect()
    for col in ("mu_logp", "old_logp", "pi_logp", "topk_tv", "topk_kl", "entropy", *(f"blocked_{r}" for r in RULES)):
        assert tokens[col].null_count() == 0, col
    assert sorted(tokens["step"].unique()) == list(range(cfg.steps))
    assert sorted(tokens["update"].unique()) == list(range(cfg.minibatches))
    # every response is trained in exactly one minibatch per epoch, every token once
    assert tokens.select("step", "sample", "pos").is_duplicated().sum() == 0
    samples = run.samples.collect()
    assert samples.height == cfg.steps * cfg.prompts_per_step * cfg.group_size
    lengths = tokens.group_by("sample").len().join(samples.select("sample", "length"), on="sample")
    assert (lengths["len"] == lengths["length"]).all()
    assert set(samples["reward"].unique()) <= {0.0, 1.0}
    # update 0 runs at the weights that sampled: π = π_old; later updates have moved π
    first = tokens.filter(pl.col("update") == 0)
    assert (first["pi_logp"] - first["old_logp"]).abs().max() < 1e-4
    later = tokens.filter((pl.col("update") > 0) & (pl.col("advantage") != 0))
    assert (later["pi_logp"] - later["old_logp"]).abs().max() > 1e-4
    # the bfloat16 engine differs from the float32 trainer, a little
    gap = (tokens["mu_logp"] - tokens["old_logp"]).abs()
    assert 0 < gap.max() < 1.0
    metrics = run.metrics.collect()
    names = set(metrics["name"])
    assert {
        "reward/mean",
        "eval/accuracy",
        "eval/accuracy_sampled",
        "entropy/mean",
        "grad_norm",
        "response_length/mean",
        "mismatch_kl",
        "k3_kl",
        "topk_tv_mean",
        "topk_tv_max",
        "topk_kl_mean",
        "log_ppl_diff",
        "time/step",
        "blocked/ppo/pos",
        "blocked/dppo_binary_tv/neg",
    } <= names
    acc = metrics.filter(pl.col("name") == "eval/accuracy").sort("step")
    assert acc["step"].to_list() == [0, cfg.steps]
    assert acc["value"].to_list() == [result.eval_accuracy[0], result.eval_accuracy[cfg.steps]]
    assert set(result.eval_accuracy_sampled) == {0, cfg.steps}
    # the active rule's share in the metrics matches its recorded column
    pos = tokens.filter(pl.col("advantage") > 0)
    per_step = metrics.filter(pl.col("name") == "blocked/ppo/pos").sort("step")["value"]
    assert per_step.mean() == pytest.approx(
        pos.group_by("step").agg(pl.col("blocked_ppo").mean()).sort("step")["blocked_ppo"].mean(), abs=1e-6
    )


def test_mismatch_presets_set_their_engine():
    assert config_from_preset("stale").rollout_config().lag == 2
    assert config_from_preset("fp8").rollout_config().precision == "fp8"
    assert "mismatch" not in PRESETS  # logit noise is not how real engines differ


def test_stale_engine_mismatch_appears_once_the_policy_moves():
    """An fp32 engine with lag 1: step 0 samples with the trainer's own weights (no mismatch);
    from step 1 on the rollouts come from the previous step's weights, so μ ≠ π_old."""
    cfg = config_from_preset(
        "quick", rule="pg_is", rollout_precision="fp32", rollout_lag=1, lr=1e-3, steps=3, eval_size=0, record=False
    )
    logged: dict[int, dict[str, float]] = {}

    class Sink:
        def log_metrics(self, step, metrics):
            logged[step] = metrics

    import trustlens.train.trainer as trainer_module

    real_log = trainer_module.log_reduced
    trainer_module.log_reduced = lambda recorder, world, step, metrics: real_log(Sink(), world, step, metrics)
    try:
        train(cfg, None, progress=False)
    finally:
        trainer_module.log_reduced = real_log
    assert logged[0]["k3_kl"] < 1e-9 and logged[0]["topk_tv_max"] < 1e-5
    assert all(logged[s]["k3_kl"] > 1e-6 and logged[s]["topk_tv_mean"] > 1e-4 for s in (1, 2))


def test_active_block_rate_skips_updates_without_signed_tokens():
    from trustlens.train.pooled import mean_of_ratios

    assert mean_of_ratios([1, 2, 0, 0, 1, 4]) == 0.375  # updates: 1/2, no A ≠ 0 token, 1/4
    assert math.isnan(mean_of_ratios([0, 0]))


def test_a_sequence_correction_trains_and_blocks_whole_responses(tmp_path):
    cfg = config_from_preset("quick", rule="gspo", loss_agg_mode="seq-mean-token-mean", low=1e-3, high=1e-3)
    train(cfg, tmp_path / "run", progress=False)
    run = trustlens.load_run(tmp_path / "run")
    assert run.manifest["active_rule"] == "gspo" and run.manifest["status"] == "finished"
    tokens = run.tokens.collect()
    keys = ["step", "update", "sample"]
    per_response = tokens.group_by(keys).agg(
        pl.col("blocked_gspo").n_unique().alias("decisions"),
        (pl.col("pi_logp").cast(pl.Float64) - pl.col("old_logp").cast(pl.Float64)).sum().alias("sum_old"),
        pl.col("seq_logratio_old").first(),
        pl.len().alias("n"),
        pl.col("seq_tokens").first(),
    )
    assert (per_response["decisions"] == 1).all()  # one decision per response
    assert (per_response["n"] == per_response["seq_tokens"]).all()
    assert (per_response["sum_old"] - per_response["seq_logratio_old"]).abs().max() < 1e-9
    assert tokens.filter(pl.col("update") > 0)["blocked_gspo"].any()  # the band bites once π moves


@pytest.mark.parametrize("rule", ["clip_cov", "kl_cov"])
def test_a_batch_correction_trains_and_marks_its_share_of_each_update(tmp_path, rule):
    cfg = config_from_preset("quick", rule=rule)
    train(cfg, tmp_path / "run", progress=False)
    run = trustlens.load_run(tmp_path / "run")
    assert run.manifest["active_rule"] == rule and run.manifest["status"] == "finished"
    tokens = run.tokens.collect()
    # clip_cov blocks minirl's tokens (PPO's clip vs π_old) and its draw on top
    per_update = tokens.group_by("step", "update").agg(
        pl.len().alias("n"),
        pl.col("blocked_kl_cov").sum().alias("penalised"),
        (pl.col("blocked_clip_cov") & ~pl.col("blocked_minirl")).sum().alias("drawn"),
    )
    # k = max(⌊2e-4·N⌋, 1) of the N response tokens of each update (A = 0 ones left out)
    k = (per_update["n"] * 2e-4).cast(pl.Int64).clip(lower_bound=1)
    assert (per_update["penalised"] <= k).all() and per_update["penalised"].sum() > 0
    assert (per_update["drawn"] <= k).all()
