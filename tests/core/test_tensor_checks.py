import math

import pytest
import torch

from trustlens.core.tensor_checks import (
    broadcast_advantages,
    check_logp,
    check_nonnegative,
    check_same_shape,
    check_tensor,
)
from trustlens.divergence import binary_kl, binary_tv


def test_positive_logp_named_with_index():
    x = torch.tensor([[-1.0, 0.5], [-0.1, -2.0]])
    with pytest.raises(ValueError, match=r"pi_logp holds positive.*\(0, 1\)"):
        check_logp("pi_logp", x)


def test_nan_and_inf_named():
    with pytest.raises(ValueError, match=r"mu_logp contains NaN.*\(1,\)"):
        binary_tv(torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, math.nan]))
    with pytest.raises(ValueError, match="pi_logp contains inf"):
        binary_kl(torch.tensor([math.inf]), torch.tensor([-1.0]))
    with pytest.raises(ValueError, match=r"d contains -inf.*\(1,\)"):
        check_nonnegative("d", torch.tensor([0.1, -math.inf]), allow_inf=True)
    with pytest.raises(ValueError, match=r"d contains inf.*\(1,\)"):
        check_nonnegative("d", torch.tensor([0.1, math.inf]))


def test_infinite_values_where_they_are_values():
    # log-probabilities may be −inf (probability 0); a KL may be +inf
    x = torch.tensor([-1.0, -math.inf])
    assert torch.equal(check_logp("pi_logp", x), x)
    kl = torch.tensor([0.1, math.inf])
    assert torch.equal(check_nonnegative("topk_kl", kl, allow_inf=True), kl)


def test_shape_mismatch_lists_shapes():
    with pytest.raises(ValueError, match=r"pi_logp \(2, 3\), mu_logp \(2, 4\)"):
        binary_tv(torch.zeros(2, 3) - 1, torch.zeros(2, 4) - 1)
    check_same_shape(a=torch.zeros(2), b=None)


def test_broadcast_advantages():
    like = torch.zeros(2, 3)
    out = broadcast_advantages(torch.tensor([1.0, -2.0]), like)
    assert out.tolist() == [[1.0] * 3, [-2.0] * 3]
    with pytest.raises(ValueError, match="advantages has shape"):
        broadcast_advantages(torch.zeros(3), like)


def test_check_tensor_takes_a_tensor_with_grad_silently():
    import warnings

    x = torch.tensor([0.5, -1.0], requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "Converting a tensor with requires_grad=True to a scalar"
        assert check_tensor("x", x) is x
