"""Which trustlens rule a verl run is recorded with (`verl_active_rule`), from verl's actor and
algorithm configs as mappings: no verl needed."""

import pytest

from trustlens.integrations.verl.rules import verl_active_rule


@pytest.mark.parametrize(
    ("actor", "algorithm", "expected"),
    [
        ({}, {}, ("minirl", 0.2, 0.2)),
        (
            {"policy_loss": {"loss_mode": "gspo"}, "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
            {},
            ("gspo", 3e-4, 4e-4),
        ),
        ({"policy_loss": {"loss_mode": "geo_mean"}, "clip_ratio": 0.4}, {}, ("gmpo", 0.4, 0.4)),
        ({}, {"rollout_correction": {"rollout_is": "token"}}, ("grpo_tis", 0.2, 0.2)),
        ({}, {"rollout_correction": {"rollout_is": "sequence"}}, ("grpo_seq_tis", 0.2, 0.2)),
        ({}, {"rollout_correction": {"bypass_mode": True}}, ("dual_clip", 0.2, 0.2)),
        # rejection: verl's band [lower, upper] is trustlens' (1 − low, 1 + high)
        ({}, {"rollout_correction": {"rollout_rs": "token", "rollout_rs_threshold": 2.0}}, ("rs_token", 0.5, 1.0)),
        (
            {},
            {
                "rollout_correction": {
                    "rollout_rs": "sequence",
                    "rollout_rs_threshold": 4.0,
                    "rollout_rs_threshold_lower": 0.5,
                }
            },
            ("rs_seq", 0.5, 3.0),
        ),
        (
            {},
            {"rollout_correction": {"rollout_rs": "geometric", "rollout_rs_threshold": "0.999_1.001"}},
            ("rs_geo", None, None),
        ),
        # verl 0.9: k1 options bound log(μ/π_old) to [log lower, log upper]; a rollout_is band is IcePop
        (
            {},
            {"rollout_correction": {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_4.0"}},
            ("rs_token", 0.75, 1.0),
        ),
        (
            {},
            {"rollout_correction": {"rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "0.5_2.0"}},
            ("rs_seq", 0.5, 1.0),
        ),
        ({}, {"rollout_correction": {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"}}, ("icepop", 0.5, 4.0)),
        ({"policy_loss": {"loss_mode": "clip_cov"}, "clip_ratio_high": 0.28}, {}, ("clip_cov", 0.2, 0.28)),
        ({"policy_loss": {"loss_mode": "kl_cov"}}, {}, ("kl_cov", None, None)),
        ({"policy_loss": {"loss_mode": "gpg"}}, {}, (None, None, None)),
        ({}, {"rollout_correction": {"rollout_rs": "seq_max_k2"}}, (None, None, None)),
    ],
)
def test_verl_settings_map_to_the_rule_they_define(actor, algorithm, expected):
    rule = verl_active_rule(actor, algorithm)
    if expected[0] == "rs_geo":
        assert rule.name == "rs_geo" and rule.low == pytest.approx(1e-3) and rule.high == pytest.approx(1e-3)
    else:
        assert (rule.name, rule.low, rule.high) == expected
    assert rule.note


def test_verl_cov_settings_become_the_batch_rules_fields():
    from trustlens.integrations import ActiveRule
    from trustlens.integrations._ray_hooks import external_rules
    from trustlens.integrations.verl.rules import verl_cov_fields

    clip = {"policy_loss": {"loss_mode": "clip_cov", "clip_cov_ratio": 1e-3, "clip_cov_ub": 4.0}}
    assert verl_cov_fields(clip) == {"cov_ratio": 1e-3, "cov_low": 1.0, "cov_high": 4.0}  # verl's lb default
    kl = {"policy_loss": {"loss_mode": "kl_cov", "ppo_kl_coef": 0.5}}
    assert verl_cov_fields(kl) == {"cov_ratio": 2e-4, "kl_coef": 0.5}
    assert verl_cov_fields({"policy_loss": {"loss_mode": "gspo"}}) == {}
    (rule,) = [r for r in external_rules(ActiveRule("kl_cov"), verl_cov_fields(kl)) if r.name == "kl_cov"]
    assert (rule.cov_ratio, rule.kl_coef) == (2e-4, 0.5)
