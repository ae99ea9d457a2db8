"""The trainer's learning-rate warm-up (`--warmup-steps`, TrainConfig.warmup_steps) and the
late_collapse preset."""

import pytest

from trustlens.train.config import PRESETS, TrainConfig, config_from_preset


def test_the_learning_rate_ramps_linearly_over_the_warm_up():
    cfg = TrainConfig(lr=1e-4, warmup_steps=4)
    assert [cfg.lr_at(s) for s in range(6)] == pytest.approx([2.5e-5, 5e-5, 7.5e-5, 1e-4, 1e-4, 1e-4])
    assert TrainConfig(lr=1e-4).lr_at(0) == 1e-4  # no warm-up
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainConfig(warmup_steps=-1)


def test_late_collapse_is_the_collapse_preset_with_a_warm_up():
    cfg = config_from_preset("late_collapse")
    assert cfg.warmup_steps == 150 and cfg.rollout_lag == PRESETS["collapse"]["rollout_lag"]
    assert cfg.steps == 400 and cfg.lr == 1e-4
