"""The checks of TokenRecorder's arguments (trustlens.record.args), called directly."""

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from trustlens.record.args import (
    check_arguments,
    check_unique,
    checked_advantages,
    config_dict,
    int_arg,
    positive_seconds,
)


def test_int_arg_takes_integers_in_range_only():
    assert int_arg("step", 3, 0, 10) == 3
    assert int_arg("step", np.int64(9), 0, 10) == 9
    assert int_arg("step", torch.tensor(4), 0, 10) == 4
    for bad in (10, -1, 2.0, True, "3", torch.tensor(1.0)):
        with pytest.raises(ValueError, match=r"step must be an integer in \[0, 10\)"):
            int_arg("step", bad, 0, 10)


def test_positive_seconds():
    assert positive_seconds("flush_seconds", 2) == 2.0
    for bad in (0, -1.0, math.inf, math.nan, True, "5"):
        with pytest.raises(ValueError, match="flush_seconds must be a finite number of seconds > 0"):
            positive_seconds("flush_seconds", bad)


def test_check_unique_names_the_repeated_id_and_its_index():
    check_unique("sample_ids", [3, 1, 2])
    with pytest.raises(ValueError, match="sample_ids holds 1 twice \\(again at index 2\\)"):
        check_unique("sample_ids", torch.tensor([1, 5, 1]))


def test_checked_advantages_per_sequence_or_per_token():
    shape = (2, 3)
    assert checked_advantages(torch.zeros(2), shape).shape == (2,)
    assert checked_advantages(torch.zeros(2, 3), shape).shape == (2, 3)
    with pytest.raises(ValueError, match=r"expected per-sequence \(2,\) or per-token \(2, 3\)"):
        checked_advantages(torch.zeros(3), shape)
    with pytest.raises(ValueError, match="advantages must be a floating-point tensor"):
        checked_advantages(torch.zeros(2, dtype=torch.int64), shape)


def test_config_dict_from_dataclass_or_mapping():
    @dataclass
    class Config:
        lr: float = 1e-3

    assert config_dict(Config()) == {"lr": 1e-3}
    assert config_dict({"lr": 2}) == {"lr": 2}
    assert config_dict(None) is None
    with pytest.raises(ValueError, match="config must be a dataclass instance or a mapping, got list"):
        config_dict([1])


def test_check_arguments_returns_the_batch_shape_and_names_what_is_wrong():
    ids, logp = torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3)
    per_token = {"pi_logp": logp, "mu_logp": logp, "old_logp": None}
    assert check_arguments(ids, per_token, None, None, 1.0) == (2, 3)
    with pytest.raises(ValueError, match="record needs mu_logp or old_logp"):
        check_arguments(ids, {"pi_logp": logp, "mu_logp": None, "old_logp": None}, None, None, 1.0)
    with pytest.raises(ValueError, match="mu_topk_ids and mu_topk_logp must be given together"):
        check_arguments(ids, per_token, torch.zeros(2, 3, 4), None, 1.0)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        check_arguments(ids, per_token, None, None, 0.0)
    with pytest.raises(ValueError, match=r"mu_logp has shape \(2, 4\); expected \(2, 3\)"):
        check_arguments(ids, {**per_token, "mu_logp": torch.zeros(2, 4)}, None, None, 1.0)
    with pytest.raises(ValueError, match="token_ids must be an integer tensor"):
        check_arguments(logp, per_token, None, None, 1.0)
