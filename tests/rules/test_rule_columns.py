import math

import numpy as np
import polars as pl
import pytest
import torch

from trustlens import rule_columns as rc
from trustlens.rules import RULES, Rule, evaluate_all, resolve_rules


def _columns(x, dtype=np.float64):
    """The token columns of `x` (every (b, t), padding included) and, broadcast to each row, its
    response's sums over the response mask, as the recorder stores them."""
    n = x["pi_logp"].numel()
    adv = x["advantages"][:, None].expand_as(x["pi_logp"])
    cols = {k: x[k].reshape(-1).numpy().astype(dtype) for k in ("pi_logp", "mu_logp", "old_logp", "topk_tv", "topk_kl")}
    mask = x["response_mask"]
    pi = torch.from_numpy(cols["pi_logp"].astype(np.float64)).reshape(mask.shape)

    def total(name):
        anchor = torch.from_numpy(cols[name].astype(np.float64)).reshape(mask.shape)
        return torch.where(mask, pi - anchor, 0.0).sum(1, keepdim=True).expand_as(pi).reshape(-1).numpy()

    sums = {"seq_logratio_mu": total("mu_logp"), "seq_logratio_old": total("old_logp")}
    sums["seq_tokens"] = mask.sum(1, keepdim=True).expand_as(pi).reshape(-1).numpy().astype(np.int32)
    return cols | sums | {"advantage": adv.reshape(-1).numpy().astype(dtype)}, n


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_evaluate_columns_equals_evaluate_all(dtype, rule_inputs):
    x = rule_inputs(b=40, t=30)
    x["pi_logp"][1, :4] = -math.inf  # probability 0: binary KL +inf
    x["topk_kl"][2, :4] = math.inf
    cols, n = _columns(x, dtype)
    frame = pl.DataFrame(cols)
    rules = [r for r in RULES if RULES[r].level != "batch"]  # decided only when recorded
    got = rc.evaluate_columns(rules, frame)
    assert got.columns == rules and got.height == n
    tensors = {k: torch.from_numpy(v).reshape(x["pi_logp"].shape) for k, v in cols.items() if "seq_" not in k}
    adv = tensors.pop("advantage")
    want = evaluate_all(rules, advantages=adv, response_mask=x["response_mask"], **tensors)
    for name in rules:
        assert got[name].to_list() == want[name].reshape(-1).tolist(), name


def test_evaluate_columns_nulls_anchor_and_custom_rules():
    frame = pl.DataFrame(
        {
            "pi_logp": [math.log(0.7), math.log(0.7), None, math.log(0.7)],
            "old_logp": [math.log(0.5), None, math.log(0.5), math.log(0.69)],
            "advantage": [1.0, 1.0, 1.0, 0.0],
        }
    )
    # a run recorded without μ: its μ-anchored rules read π_old; a row with a null input is null
    got = rc.evaluate_columns(["ppo", "dppo_binary_tv"], frame, mu="old_logp")
    assert got.to_dict(as_series=False) == {
        "ppo": [True, None, None, False],
        "dppo_binary_tv": [True, None, None, False],
    }
    # a custom rule as a run's manifest records it comes back from the manifest alone
    loose = Rule("loose_tv", 0.5, 0.5, "old", "binary_tv", "binary TV vs π_old with a 0.5 bound")
    manifest = {"loose_tv": loose.manifest_entry(), "ppo": {"low": 0.2, "high": 0.5, "anchor": "mu"}}
    assert resolve_rules(manifest) == [loose, RULES["ppo"].with_thresholds(high=0.5)]
    got = rc.evaluate_columns(manifest, frame, mu="old_logp")
    assert got["loose_tv"].to_list() == [False, None, None, False] and got["ppo"].to_list()[0] is False
    with pytest.raises(ValueError, match=r"rule 'mine' is not a built-in rule and its record names no measure"):
        resolve_rules({"mine": {"low": 0.1, "high": 0.1}})
    with pytest.raises(ValueError, match=r"rule 'ppo' reads the column 'mu_logp', which columns lacks"):
        rc.evaluate_columns(["ppo"], frame)
    bad = frame.with_columns(pl.lit(0.5).alias("pi_logp"))
    with pytest.raises(ValueError, match=r"column 'pi_logp' holds a value that is not a log-probability .* row 0"):
        rc.evaluate_columns(["ppo"], bad, mu="old_logp")
    assert rc.rule_columns("dppo_topk_kl") == ("pi_logp", "mu_logp", "advantage", "topk_kl")
    assert rc.rule_columns("grpo_tis", mu="old_logp") == ("pi_logp", "advantage", "old_logp")


def test_decide_columns_computes_each_distance_once_or_takes_it_given():
    columns = {
        "pi_logp": np.log(np.array([0.7, 0.2, 0.5], np.float32)),
        "mu_logp": np.log(np.array([0.5, 0.4, 0.5], np.float32)),
        "advantage": np.array([1.0, -1.0, 1.0], np.float32),
    }
    eps = float(np.finfo(np.float32).eps)
    distances: dict = {}
    tv = rc.decide_columns(RULES["dppo_binary_tv"], columns.__getitem__, "mu_logp", distances, eps)
    assert tv.tolist() == [True, True, False]  # |π − μ| = 0.2, 0.2, 0 against δ = 0.15
    assert list(distances) == [("binary_tv", "mu_logp", "pi")]
    # a distance handed in is used as it is (the recorder hands in the binary TV it stores)
    given = {("binary_tv", "mu_logp", "pi"): np.array([0.0, 0.0, 1.0], np.float32)}
    tv = rc.decide_columns(RULES["dppo_binary_tv"], columns.__getitem__, "mu_logp", given, eps)
    assert tv.tolist() == [False, False, False]  # the third: π = μ, no push away from μ
    never = rc.decide_columns(RULES["cispo"], columns.__getitem__, "mu_logp", {}, eps)
    assert never.tolist() == [False, False, False]
