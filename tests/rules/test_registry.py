"""The rule registry: `register_rule` (function and decorator), its refusals, the one dispatch
over a rule's level on torch and numpy alike, and the weight table of the loss."""

from typing import get_args

import numpy as np
import pytest
import torch

from trustlens.rules import CORRECTIONS, RULES, Level, Rule, TokenInputs, WeightKind, get_rule, register_rule, registry
from trustlens.rules.columns import ColumnInputs
from trustlens.rules.sequence import sequence_statistics


@pytest.fixture
def restore_registry():
    before = dict(RULES)
    yield
    RULES.clear()
    RULES.update(before)


def test_registry_lists_the_22_rules_trust_regions_first():
    assert len(RULES) == 22 and list(RULES)[:3] == ["ppo", "ppo_clip_higher", "minirl"]
    assert [r.name for r in CORRECTIONS] == list(RULES)[12:]
    assert CORRECTIONS[0].name == "icepop" and CORRECTIONS[-1].name == "kl_cov"
    assert {r.level for r in RULES.values()} == set(get_args(Level))


def test_register_rule_as_function_and_decorator(restore_registry):
    tight = Rule("tight_tv", 0.01, 0.01, "mu", "binary_tv", "binary TV with a 0.01 bound")
    assert register_rule(tight) is tight and get_rule("tight_tv") is tight

    @register_rule
    def tight_kl() -> Rule:
        """A test rule."""
        return Rule("tight_kl", 0.01, 0.01, "mu", "binary_kl", "binary KL with a 0.01 bound")

    assert callable(tight_kl) and RULES["tight_kl"].measure == "binary_kl"
    assert list(RULES)[-2:] == ["tight_tv", "tight_kl"]


def test_register_rule_refuses(restore_registry):
    with pytest.raises(ValueError, match="a rule named 'ppo' is already registered"):
        register_rule(RULES["ppo"])
    with pytest.raises(ValueError, match="the entry of rule 'other' must be named 'other'"):

        @register_rule
        def misnamed() -> Rule:
            return Rule("other", 0.1, 0.1, "mu", "ratio", "")

    with pytest.raises(TypeError, match="must be a Rule or return one"):
        register_rule(lambda: "ppo")  # type: ignore[arg-type, return-value]
    assert "other" not in RULES


def test_unknown_rule_is_refused_naming_every_registered_one():
    with pytest.raises(KeyError) as err:
        get_rule("ppo2")
    assert "did you mean 'ppo'" in str(err.value) or "'ppo'" in str(err.value)
    assert all(name in str(err.value) for name in RULES)
    assert registry.get_rule is get_rule


def _inputs(gen, b=4, t=6):
    mu = torch.log_softmax(torch.randn(b, t, 5, generator=gen, dtype=torch.float64) * 2, -1)[..., 0]
    old = (mu + 0.3 * torch.randn(b, t, generator=gen, dtype=torch.float64)).clamp(max=-1e-3)
    pi = (old + 0.3 * torch.randn(b, t, generator=gen, dtype=torch.float64)).clamp(max=-1e-3)
    mask = torch.ones(b, t, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0], dtype=torch.float64)
    return pi, mu, old, mask, adv


@pytest.mark.parametrize("rule", [r for r in RULES if RULES[r].measure not in ("topk_tv", "topk_kl")])
def test_one_dispatch_decides_alike_on_torch_and_numpy(gen, rule):
    pi, mu, old, mask, adv = _inputs(gen)
    x = TokenInputs(pi_logp=pi, mu_logp=mu, advantages=adv, old_logp=old, response_mask=mask, seed=(3, 1))
    sample = np.repeat(np.arange(pi.shape[0]), pi.shape[1])
    stats = sequence_statistics(
        pi.numpy().ravel(),
        mu.numpy().ravel(),
        old.numpy().ravel(),
        lambda v: np.bincount(sample, weights=v)[sample],
        np.full(sample.shape, float(pi.shape[1])),
    )
    columns = {
        "pi_logp": pi.numpy().ravel(),
        "mu_logp": mu.numpy().ravel(),
        "old_logp": old.numpy().ravel(),
        "advantage": adv[:, None].expand_as(pi).numpy().ravel(),
        **stats,
    }
    on_columns = ColumnInputs(columns.__getitem__, eps=float(np.finfo(np.float64).eps), seed=(3, 1))
    assert x.blocked(RULES[rule]).numpy().ravel().tolist() == on_columns.blocked(RULES[rule]).tolist()


def test_the_sequence_statistics_of_torch_and_numpy_are_one_definition(gen):
    pi, mu, old, mask, adv = _inputs(gen)
    mask[1, 3:] = False
    x = TokenInputs(pi_logp=pi, mu_logp=mu, advantages=adv, old_logp=old, response_mask=mask)
    sums = x.sequence_sums()
    by_hand = [sum(float(pi[b, t] - mu[b, t]) for t in range(6) if mask[b, t]) for b in range(4)]
    assert sums["seq_logratio_mu"][:, 0].tolist() == pytest.approx(by_hand, rel=1e-14)
    assert sums["seq_tokens"][:, 0].tolist() == [6.0, 3.0, 6.0, 6.0]


def test_every_weight_kind_has_its_weight_in_the_table():
    from trustlens.rules.loss import WEIGHTS

    assert set(WEIGHTS) == set(get_args(WeightKind))


def test_rule_from_manifest_reads_old_entries_against_the_registry():
    from trustlens.rules import rule_from_manifest

    # an entry written before the manifest kept the measure: the registry's rule, its thresholds
    assert rule_from_manifest("ppo", {"low": 0.1, "high": 0.3}) == RULES["ppo"].with_thresholds(0.1, 0.3)
    entry = {k: v for k, v in RULES["gspo"].manifest_entry().items() if k != "description"}
    assert rule_from_manifest("gspo", entry) == RULES["gspo"]  # the description from the registry
    with pytest.raises(ValueError, match=r"'ppo' is not a built-in rule .*rules.rule_from_manifest"):
        Rule.from_manifest("ppo", {"low": 0.1, "high": 0.3})  # without the registry's rule
