"""Bad inputs to the value checks, the tensor checks, the divergences and the rules: each case
asserts the error type and that the message names the argument; valid edge cases assert the
right result (issue 32)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from trustlens.core import argument_checks, tensor_checks
from trustlens.divergence import binary_kl, binary_tv, exact_divergence, topk_divergence
from trustlens.rules import RULES, Rule, evaluate, evaluate_all
from trustlens.rules.loss import policy_loss

NAN, INF = math.nan, math.inf

# (check, kwargs, bad value, error type)
VALUE_CASES = [
    *[
        (argument_checks.check_positive, {}, v, e)
        for v, e in [
            (0, ValueError),
            (-1, ValueError),
            (NAN, ValueError),
            (INF, ValueError),
            (-INF, ValueError),
            ("1", TypeError),
            (None, TypeError),
            (True, TypeError),
            ([1], TypeError),
        ]
    ],
    *[
        (argument_checks.check_nonnegative_number, {}, v, e)
        for v, e in [
            (-1e-9, ValueError),
            (NAN, ValueError),
            (INF, ValueError),
            ("0", TypeError),
            (None, TypeError),
            (False, TypeError),
        ]
    ],
    *[
        (argument_checks.check_fraction, {}, v, e)
        for v, e in [(-0.1, ValueError), (1.1, ValueError), (NAN, ValueError), (INF, ValueError), ("0.5", TypeError)]
    ],
    *[(argument_checks.check_fraction, {"zero": False, "one": False}, v, ValueError) for v in (0, 1, 0.0, 1.0)],
    *[
        (argument_checks.check_int, {"low": 1}, v, e)
        for v, e in [
            (0, ValueError),
            (-3, ValueError),
            (1.0, TypeError),
            (2.5, TypeError),
            (NAN, TypeError),
            (True, TypeError),
            ("3", TypeError),
            (None, TypeError),
            (np.float64(2.0), TypeError),
        ]
    ],
    *[(argument_checks.check_int, {"low": 0, "high": 9}, v, ValueError) for v in (-1, 10, np.int64(10))],
    *[(argument_checks.check_optional_int, {"low": 1}, v, e) for v, e in [(0, ValueError), (1.5, TypeError)]],
    *[(argument_checks.check_number, {"low": 1.0, "low_open": True}, v, ValueError) for v in (1, 0.5, -INF, NAN)],
    *[
        (argument_checks.check_choice, {"choices": ["ppo", "cispo"]}, v, e)
        for v, e in [
            ("PPO", ValueError),
            ("", ValueError),
            ("pp", ValueError),
            (None, TypeError),
            (1, TypeError),
            (["ppo"], TypeError),
        ]
    ],
    *[
        (argument_checks.check_str, {}, v, e)
        for v, e in [("", ValueError), (None, TypeError), (3, TypeError), (b"x", TypeError)]
    ],
    *[
        (argument_checks.check_path, {}, v, e)
        for v, e in [
            ("", ValueError),
            ("   ", ValueError),
            ("a\x00b", ValueError),
            (None, TypeError),
            (3, TypeError),
            (b"/tmp", TypeError),
            (["/tmp"], TypeError),
        ]
    ],
    *[
        (argument_checks.check_port, {}, v, e)
        for v, e in [
            (0, ValueError),
            (65536, ValueError),
            (99999, ValueError),
            (-1, ValueError),
            (8501.0, TypeError),
            ("8501", TypeError),
        ]
    ],
]


VALUE_CASES += [
    *[(argument_checks.check_bool, {}, v, TypeError) for v in ("no", "false", 1, 0, None, 1.0)],
    *[
        (argument_checks.check_step_range, {}, v, e)
        for v, e in [
            (3, TypeError),
            ((5, 1), ValueError),
            ((-2, 1), ValueError),
            ((0, 1.5), TypeError),
            ((1, 2, 3), TypeError),
        ]
    ],
    (argument_checks.check_type, {"kinds": dict, "expected": "a mapping"}, [1], TypeError),
    (argument_checks.check_columns, {"required": ["step"]}, ["k3"], ValueError),
    *[
        (argument_checks.check_interval, {}, v, e)
        for v, e in [(1.0, TypeError), ((2.0, 0.0), ValueError), ((1.0, 1.0), ValueError), ((NAN, 1.0), ValueError)]
    ],
    *[
        (argument_checks.check_sequence, {"empty": False}, v, e)
        for v, e in [("ab", TypeError), ({"a": 1}, TypeError), (3, TypeError), ([], ValueError)]
    ],
    *[
        (argument_checks.check_numbers, {"low": 0.0, "high": 1.0}, v, e)
        for v, e in [(0.5, TypeError), ([], ValueError), ([1.5], ValueError), ([NAN], ValueError), (["0.5"], TypeError)]
    ],
    *[
        (argument_checks.check_names, {"choices": ["ratio", "entropy"]}, v, e)
        for v, e in [("ratio", TypeError), (["ratoi"], ValueError), ([3], TypeError), (["ratio", "ratio"], ValueError)]
    ],
    *[
        (argument_checks.check_step_values, {}, v, e)
        for v, e in [
            ([0.5, 0.4], TypeError),
            (None, TypeError),
            ([(0, NAN)], ValueError),
            ([(0, None)], TypeError),
            ([(1.5, 0.2)], TypeError),
            ([(-1, 0.2)], ValueError),
        ]
    ],
    *[
        (argument_checks.check_keys, {"allowed": ["low", "high"]}, v, e)
        for v, e in [({"lo": 0.2}, ValueError), (0.2, TypeError)]
    ],
]


@pytest.mark.parametrize(("check", "kwargs", "value", "error"), VALUE_CASES)
def test_value_checks_name_the_argument(check, kwargs, value, error):
    with pytest.raises(error, match=r"^the_arg"):
        check("the_arg", value, **kwargs)


@pytest.mark.parametrize(
    ("check", "kwargs", "value", "expected"),
    [
        (argument_checks.check_positive, {}, 1e-300, 1e-300),
        (argument_checks.check_positive, {}, np.float32(0.5), 0.5),
        (argument_checks.check_nonnegative_number, {}, 0, 0.0),
        (argument_checks.check_fraction, {}, 1, 1.0),
        (argument_checks.check_int, {"low": 0}, np.int64(3), 3),
        (argument_checks.check_optional_int, {"low": 1}, None, None),
        (argument_checks.check_choice, {"choices": ["a", "b"]}, "b", "b"),
        (argument_checks.check_path, {}, Path("."), Path(".")),
        (argument_checks.check_path, {}, "s3://bucket/run", "s3://bucket/run"),
        (argument_checks.check_port, {}, 65535, 65535),
        (argument_checks.check_interval, {}, [0, 2], (0.0, 2.0)),
        (argument_checks.check_numbers, {"low": 0.0}, (0, 0.5), [0.0, 0.5]),
        (argument_checks.check_numbers, {"empty": True}, [], []),
        (argument_checks.check_names, {"choices": ["a", "b"]}, ("b", "a"), ["b", "a"]),
        (argument_checks.check_step_values, {}, [(0, 0.5), (3, 1)], [(0, 0.5), (3, 1.0)]),
        (argument_checks.check_sequence, {}, range(2), [0, 1]),
    ],
)
def test_value_checks_accept_valid_values(check, kwargs, value, expected):
    assert check("x", value, **kwargs) == expected


def test_a_typo_names_the_closest_choice():
    with pytest.raises(
        ValueError, match=r"rule must be one of .*got 'dppo_binary_tvv' \(did you mean 'dppo_binary_tv'\?\)"
    ):
        argument_checks.check_choice("rule", "dppo_binary_tvv", list(RULES))


T = torch.tensor
GOOD = T([-0.5, -1.0])

# (tensor check, bad value, error) ; the argument is named "arg"
TENSOR_CASES = [
    *[
        (tensor_checks.check_logp, v)
        for v in (T([0.5, -1.0]), T([NAN, -1.0]), T([INF, -1.0]), T([1, 2]), [-1.0], None, np.array([-1.0]), T([True]))
    ],
    *[(tensor_checks.check_tensor, v) for v in (T([NAN]), T([INF]), T([-INF]), T([1]), "x", 1.0)],
    *[(tensor_checks.check_nonnegative, v) for v in (T([-0.1]), T([NAN]), T([INF]), T([-INF]), [0.1])],
    *[(tensor_checks.check_tv, v) for v in (T([1.7]), T([-0.2]), T([NAN]), T([INF]), T([0.5, 1.01]), 0.5)],
    *[
        (lambda name, t: tensor_checks.check_token_ids(name, t, 5), v)
        for v in (T([5]), T([-1]), T([1.0]), T([True]), [1])
    ],
    *[
        (lambda name, t: tensor_checks.check_token_ids(name, t, 9, distinct=True), v)
        for v in (T([[1, 1]]), T([[0, 3, 0]]))
    ],
    *[(lambda name, t: tensor_checks.check_mask(name, t, GOOD), v) for v in (T([1, 2]), T([0.5, 1.0]), T([1]), None)],
]


@pytest.mark.parametrize(("check", "value"), TENSOR_CASES)
def test_tensor_checks_name_the_argument(check, value):
    with pytest.raises(ValueError, match="arg"):
        check("arg", value)


def test_valid_tensor_edge_cases():
    assert tensor_checks.check_logp("x", T([-INF, 0.0])).tolist() == [-INF, 0.0]  # −inf: probability 0
    assert tensor_checks.check_nonnegative("x", T([INF]), allow_inf=True).tolist() == [INF]  # a KL of +inf
    assert tensor_checks.check_tv("x", T([1.0 + 1e-7, 0.0])).tolist() == [1.0, 0.0]  # rounding above 1 clamps
    assert tensor_checks.check_logp("x", torch.empty(0)).numel() == 0
    tensor_checks.check_same_device(a=T([1.0]), b=None, c="not a tensor")  # only the tensors are compared


META = torch.zeros(2, device="meta")
LOGITS = torch.zeros(2, 5)
IDS = T([[0, 1], [2, 3]])
LOGP = T([[-1.0, -2.0], [-1.0, -2.0]])

# (function, kwargs, error, the argument the message must name)
MATH_CASES = [
    (binary_tv, dict(pi_logp=T([0.1]), mu_logp=T([-1.0])), ValueError, "pi_logp"),
    (binary_tv, dict(pi_logp=T([-1.0]), mu_logp=T([NAN])), ValueError, "mu_logp"),
    (binary_tv, dict(pi_logp=T([-1.0]), mu_logp=T([-1.0, -2.0])), ValueError, "mu_logp"),
    (binary_tv, dict(pi_logp=[-1.0], mu_logp=T([-1.0])), ValueError, "pi_logp"),
    (binary_tv, dict(pi_logp=GOOD, mu_logp=META), ValueError, "mu_logp on meta"),
    (binary_kl, dict(pi_logp=GOOD, mu_logp=META), ValueError, "mu_logp on meta"),
    (binary_kl, dict(pi_logp=T([INF]), mu_logp=T([-1.0])), ValueError, "pi_logp"),
    (binary_kl, dict(pi_logp=T([-1]), mu_logp=T([-1.0])), ValueError, "pi_logp"),
    (
        topk_divergence,
        dict(pi_logits=LOGITS, mu_topk_ids=IDS, mu_topk_logp=LOGP.to("meta")),
        ValueError,
        "mu_topk_logp on meta",
    ),
    (
        topk_divergence,
        dict(pi_logits=LOGITS.to("meta"), mu_topk_ids=IDS, mu_topk_logp=LOGP),
        ValueError,
        "pi_logits on meta",
    ),
    (
        topk_divergence,
        dict(pi_logits=LOGITS, mu_topk_ids=IDS.to("meta"), mu_topk_logp=LOGP),
        ValueError,
        "mu_topk_ids on meta",
    ),
    (
        topk_divergence,
        dict(pi_logits=LOGITS, mu_topk_ids=IDS, mu_topk_logp=LOGP, sampled_ids=T([0, 2]).to("meta")),
        ValueError,
        "sampled_ids on meta",
    ),
    (
        topk_divergence,
        dict(pi_logits=LOGITS, mu_topk_ids=IDS, mu_topk_logp=LOGP, temperature=0),
        ValueError,
        "temperature",
    ),
    (
        topk_divergence,
        dict(pi_logits=LOGITS, mu_topk_ids=IDS, mu_topk_logp=LOGP, temperature=INF),
        ValueError,
        "temperature",
    ),
    (
        topk_divergence,
        dict(pi_logits=LOGITS, mu_topk_ids=IDS, mu_topk_logp=LOGP, temperature=NAN),
        ValueError,
        "temperature",
    ),
    (
        topk_divergence,
        dict(pi_logits=LOGITS, mu_topk_ids=T([[0, 9], [1, 2]]), mu_topk_logp=LOGP),
        ValueError,
        "mu_topk_ids",
    ),
    (
        topk_divergence,
        dict(pi_logits=LOGITS, mu_topk_ids=T([[0, 0], [1, 2]]), mu_topk_logp=LOGP),
        ValueError,
        "mu_topk_ids",
    ),
    (topk_divergence, dict(pi_logits=LOGITS, mu_topk_ids=IDS.float(), mu_topk_logp=LOGP), ValueError, "mu_topk_ids"),
    (topk_divergence, dict(pi_logits=LOGITS, mu_topk_ids=IDS, mu_topk_logp=-LOGP), ValueError, "mu_topk_logp"),
    (topk_divergence, dict(pi_logits=LOGITS, mu_topk_ids=IDS, mu_topk_logp=LOGP[:, :1]), ValueError, "mu_topk_logp"),
    (
        topk_divergence,
        dict(pi_logits=torch.full((2, 5), NAN), mu_topk_ids=IDS, mu_topk_logp=LOGP),
        ValueError,
        "pi_logits",
    ),
    (topk_divergence, dict(pi_logits=LOGITS.long(), mu_topk_ids=IDS, mu_topk_logp=LOGP), ValueError, "pi_logits"),
    (topk_divergence, dict(pi_logits=LOGITS, mu_topk_ids=[[0, 1]], mu_topk_logp=LOGP), ValueError, "mu_topk_ids"),
    (exact_divergence, dict(pi_logits=LOGITS, mu_logits=LOGITS.to("meta")), ValueError, "mu_logits on meta"),
    (exact_divergence, dict(pi_logits=LOGITS, mu_logits=torch.zeros(2, 4)), ValueError, "mu_logits"),
    (exact_divergence, dict(pi_logits=LOGITS, mu_logits=torch.full((2, 5), INF)), ValueError, "mu_logits"),
    (exact_divergence, dict(pi_logits=LOGITS, mu_logits=LOGITS, temperature=-1), ValueError, "temperature"),
    (exact_divergence, dict(pi_logits=None, mu_logits=LOGITS), ValueError, "pi_logits"),
    (
        topk_divergence,  # a_t = 4 is in neither set: forcing it in needs its log μ
        dict(pi_logits=LOGITS, mu_topk_ids=IDS, mu_topk_logp=LOGP, sampled_ids=T([4, 4])),
        ValueError,
        "sampled_logp",
    ),
]


@pytest.mark.parametrize(("function", "kwargs", "error", "named"), MATH_CASES)
def test_divergences_name_the_argument(function, kwargs, error, named):
    with pytest.raises(error, match=named):
        function(**kwargs)


RULE_INPUTS = dict(pi_logp=T([-1.0, -2.0]), mu_logp=T([-1.0, -2.5]), advantages=T([1.0, -1.0]))

RULE_CASES = [
    ("dppo_topk_tv", dict(topk_tv=T([0.1, 1.7]), topk_kl=T([0.1, 0.1])), ValueError, "topk_tv"),
    ("dppo_topk_tv", dict(topk_tv=T([0.1, -0.1]), topk_kl=T([0.1, 0.1])), ValueError, "topk_tv"),
    ("dppo_topk_kl", dict(topk_tv=T([0.1, 0.1]), topk_kl=T([-1.0, 0.1])), ValueError, "topk_kl"),
    ("dppo_topk_kl", dict(topk_tv=T([0.1, 0.1]), topk_kl=T([NAN, 0.1])), ValueError, "topk_kl"),
    ("dppo_topk_tv", {}, ValueError, "topk_tv"),
    ("minirl", {}, ValueError, "old_logp"),
    ("ppo", dict(mu_logp=T([-1.0, -2.0]).to("meta")), ValueError, "mu_logp on meta"),
    ("ppo", dict(advantages=T([1.0, -1.0]).to("meta")), ValueError, "advantages on meta"),
    ("ppo", dict(old_logp=T([-1.0, -2.0]).to("meta")), ValueError, "old_logp on meta"),
    ("ppo", dict(advantages=T([1.0, NAN])), ValueError, "advantages"),
    ("ppo", dict(advantages=T([1.0, 1.0, 1.0])), ValueError, "advantages"),
    ("ppo", dict(pi_logp=T([0.3, -1.0])), ValueError, "pi_logp"),
    ("ppo", dict(mu_logp=T([-1.0])), ValueError, "mu_logp"),
    ("ppo", dict(low=-0.1), ValueError, "low"),
    ("ppo", dict(high=NAN), ValueError, "high"),
    ("dppo_binary_tv", dict(high=1.5), ValueError, "high must be ≤ 1"),
    ("dppo_topk_tv", dict(low=2.0, topk_tv=T([0.1, 0.1])), ValueError, "low must be ≤ 1"),
    ("dppo_binary_tvv", {}, KeyError, "dppo_binary_tvv"),
    ("PPO", {}, KeyError, "PPO"),
    (None, {}, KeyError, "None"),
]


@pytest.mark.parametrize(("rule", "kwargs", "error", "named"), RULE_CASES)
def test_rules_name_the_argument(rule, kwargs, error, named):
    with pytest.raises(error, match=named):
        evaluate(rule, **{**RULE_INPUTS, **kwargs})


@pytest.mark.parametrize(
    ("call", "error", "named"),
    [
        (lambda: evaluate_all(3, **RULE_INPUTS), TypeError, "rules"),
        (lambda: evaluate_all("ppo", **RULE_INPUTS), ValueError, "rules"),
        (lambda: Rule("mine", 0.1, 0.1, "mu", "ratio", None), TypeError, "description"),
        (lambda: Rule("mine", 0.1, 1.2, "mu", "binary_tv", "x"), ValueError, "high"),
        (
            lambda: policy_loss(
                "ppo", **{k: v[None] for k, v in RULE_INPUTS.items()}, response_mask=torch.ones(1, 2, device="meta")
            ),
            ValueError,
            "response_mask is on device meta",
        ),
    ],
)
def test_rule_sets_and_the_loss_name_the_argument(call, error, named):
    with pytest.raises(error, match=named):
        call()


def test_valid_rule_and_divergence_edge_cases():
    assert evaluate_all([], **RULE_INPUTS) == {}  # no rules, as the recorder's rules=[]
    # a sampled token already in every top-K set needs no sampled_logp: nothing to force
    plain = topk_divergence(LOGITS, IDS, LOGP)
    given = topk_divergence(LOGITS, IDS, LOGP, sampled_ids=T([1, 2]))
    assert all(torch.equal(a, b) for a, b in zip(plain, given, strict=True))
    assert Rule("mine", 1.0, 1.0, "mu", "binary_tv", "x").high == 1.0  # TV bound 1: the largest
    # π(a_t) = 0: binary TV is μ(a_t), binary KL +inf; the rules block where the distance is beyond δ
    assert binary_tv(T([-INF]), T([math.log(0.25)])).tolist() == [0.25]
    assert binary_kl(T([-INF]), T([math.log(0.25)])).tolist() == [INF]
    # A < 0 and π(a_t) = 0 < μ(a_t) − δ: the update would push π further down, blocked
    blocked = evaluate(
        "dppo_binary_tv", pi_logp=T([-INF, -1.0]), mu_logp=T([math.log(0.5), -1.0]), advantages=T([-1.0, -1.0])
    )
    assert blocked.tolist() == [True, False]
    # a TV of exactly 1 is the largest allowed: decided like any TV beyond δ
    at_one = evaluate("dppo_topk_tv", **RULE_INPUTS, topk_tv=T([1.0, 1.0]), topk_kl=T([INF, 0.0]))
    assert (
        at_one.tolist()
        == evaluate("dppo_topk_tv", **RULE_INPUTS, topk_tv=T([0.9, 0.9]), topk_kl=T([1.0, 0.0])).tolist()
    )
