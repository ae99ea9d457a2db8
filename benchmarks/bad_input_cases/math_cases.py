"""The math: trustlens.divergence, trustlens.rules (evaluate, evaluate_all, get_rule) and
policy_loss given tensors of the wrong kind, shape, device or domain, and their valid edges."""

from __future__ import annotations

import math

import numpy as np
import torch

from bad_input_cases import INF, NAN, Case, Fixtures, bad, ok
from trustlens import (
    binary_kl,
    binary_tv,
    entropy_from_logits,
    evaluate,
    evaluate_all,
    exact_divergence,
    policy_loss,
    topk_divergence,
    topk_from_logits,
)
from trustlens.rules import get_rule

A = "math"
B, T, V, K = 2, 3, 11, 4


def _lp(value: float = -1.0, shape: tuple[int, ...] = (B, T)) -> torch.Tensor:
    return torch.full(shape, value)


def _inputs(**over):
    kw = dict(pi_logp=_lp(-1.0), mu_logp=_lp(-1.1), advantages=torch.tensor([1.0, -1.0]))
    kw.update(over)
    return kw


def _topk(**over):
    logits = torch.randn(B, T, V, generator=torch.Generator().manual_seed(0))
    ids = torch.arange(K).expand(B, T, K).clone()
    logp = torch.log_softmax(torch.randn(B, T, V, generator=torch.Generator().manual_seed(1)), -1)[..., :K]
    kw = dict(pi_logits=logits, mu_topk_ids=ids, mu_topk_logp=logp)
    kw.update(over)
    return kw


def _close(x: torch.Tensor, value: float) -> bool:
    return bool(torch.allclose(x.double(), torch.full_like(x.double(), value), atol=1e-6))


def _tensor_wrongs(name: str) -> list[tuple[str, object, tuple[str, ...]]]:
    """(label, value, words) of wrong tensors for a (B, T) log-probability argument."""
    return [
        ("a list", [[-1.0] * T] * B, (name,)),
        ("None", None, (name,)),
        ("a numpy array", np.full((B, T), -1.0), (name,)),
        ("an int tensor", torch.zeros(B, T, dtype=torch.long), (name,)),
        ("probabilities", _lp(0.5), (name,)),
        ("NaN", torch.tensor([[-1.0, NAN, -1.0]] * B), (name, "nan")),
        ("+inf", torch.tensor([[-1.0, INF, -1.0]] * B), (name,)),
        ("another shape", _lp(-1.0, (B, T + 1)), (name, "shape")),
        ("another device", torch.full((B, T), -1.0, device="meta"), (name, "device")),
    ]


def cases(fx: Fixtures) -> list[Case]:
    out: list[Case] = []
    for fn in (binary_tv, binary_kl):
        for arg in ("pi_logp", "mu_logp"):
            for label, value, words in _tensor_wrongs(arg):
                kw = {"pi_logp": _lp(-1.0), "mu_logp": _lp(-1.2), arg: value}
                out.append(bad(A, f"{fn.__name__} {arg} {label}", lambda fn=fn, kw=kw: fn(**kw), *words))
    out += [
        ok(A, "binary_tv equal", lambda: binary_tv(_lp(-0.5), _lp(-0.5)), lambda r: _close(r, 0.0)),
        ok(A, "binary_tv -inf both", lambda: binary_tv(_lp(-INF), _lp(-INF)), lambda r: _close(r, 0.0)),
        ok(A, "binary_tv 1 vs 0", lambda: binary_tv(_lp(0.0), _lp(-INF)), lambda r: _close(r, 1.0)),
        ok(A, "binary_tv half", lambda: binary_tv(_lp(math.log(0.75)), _lp(math.log(0.25))), lambda r: _close(r, 0.5)),
        ok(A, "binary_kl p=q", lambda: binary_kl(_lp(-2.0), _lp(-2.0)), lambda r: _close(r, 0.0)),
        ok(
            A,
            "binary_kl closed form",
            lambda: binary_kl(_lp(math.log(0.5)), _lp(math.log(0.25))),
            lambda r: _close(r, 0.25 * math.log(0.5) + 0.75 * math.log(1.5)),
        ),
        ok(
            A,
            "binary_kl pi 0 where mu >0",
            lambda: binary_kl(_lp(-INF), _lp(-1.0)),
            lambda r: bool(torch.isinf(r).all()),
        ),
        ok(A, "binary_tv empty", lambda: binary_tv(torch.zeros(0), torch.zeros(0)), lambda r: r.numel() == 0),
        ok(
            A,
            "binary_tv float64",
            lambda: binary_tv(_lp(-1.0).double(), _lp(-1.0).double()),
            lambda r: r.dtype == torch.float64,
        ),
    ]
    # top-K divergence
    topk_bad = {
        "ids float": (dict(mu_topk_ids=torch.zeros(B, T, K)), ("mu_topk_ids",)),
        "ids out of vocab": (dict(mu_topk_ids=torch.full((B, T, K), V)), ("mu_topk_ids", "vocabulary")),
        "ids negative": (dict(mu_topk_ids=torch.full((B, T, K), -1)), ("mu_topk_ids",)),
        "ids repeated": (dict(mu_topk_ids=torch.zeros(B, T, K, dtype=torch.long)), ("mu_topk_ids",)),
        "ids list": (dict(mu_topk_ids=[[0, 1, 2, 3]]), ("mu_topk_ids",)),
        "ids shape": (dict(mu_topk_ids=torch.arange(K + 1).expand(B, T, K + 1).clone()), ("mu_topk",)),
        "logp positive": (dict(mu_topk_logp=torch.full((B, T, K), 0.5)), ("mu_topk_logp",)),
        "logp NaN": (dict(mu_topk_logp=torch.full((B, T, K), NAN)), ("mu_topk_logp",)),
        "logp int": (dict(mu_topk_logp=torch.zeros(B, T, K, dtype=torch.long)), ("mu_topk_logp",)),
        "logp over one": (dict(mu_topk_logp=torch.full((B, T, K), math.log(0.5))), ("mu_topk_logp",)),
        "logits int": (dict(pi_logits=torch.zeros(B, T, V, dtype=torch.long)), ("pi_logits",)),
        "logits NaN": (dict(pi_logits=torch.full((B, T, V), NAN)), ("pi_logits", "nan")),
        "logits 2-D": (dict(pi_logits=torch.zeros(B * T, V)), ("shape",)),
        "logits None": (dict(pi_logits=None), ("pi_logits",)),
        "logits numpy": (dict(pi_logits=np.zeros((B, T, V))), ("pi_logits",)),
        "logits other device": (dict(pi_logits=torch.zeros(B, T, V, device="meta")), ("device",)),
        "temperature 0": (dict(temperature=0), ("temperature",)),
        "temperature -1": (dict(temperature=-1.0), ("temperature",)),
        "temperature NaN": (dict(temperature=NAN), ("temperature",)),
        "temperature inf": (dict(temperature=INF), ("temperature",)),
        "temperature text": (dict(temperature="1"), ("temperature",)),
        "temperature tensor of 2": (dict(temperature=torch.ones(2)), ("temperature",)),
        "sampled_ids outside S without logp": (
            dict(sampled_ids=torch.full((B, T), V - 1)),
            ("sampled_logp", "sampled token"),
        ),
        "sampled_ids float": (
            dict(sampled_ids=torch.zeros(B, T), sampled_logp=_lp(-1.0)),
            ("sampled_ids",),
        ),
        "sampled_ids shape": (
            dict(sampled_ids=torch.zeros(B, T + 1, dtype=torch.long), sampled_logp=_lp(-1.0, (B, T + 1))),
            ("sampled",),
        ),
    }
    for label, (over, words) in topk_bad.items():
        out.append(bad(A, f"topk_divergence {label}", lambda over=over: topk_divergence(**_topk(**over)), *words))
    out.append(
        ok(
            A,
            "topk_divergence in range",
            lambda: topk_divergence(**_topk()),
            lambda r: bool(((r[0] >= 0) & (r[0] <= 1)).all() and (r[1] >= 0).all()),
        )
    )
    out.append(
        ok(
            A,
            "topk_divergence sampled_ids in S without logp (nothing to force)",
            lambda: (
                topk_divergence(**_topk(sampled_ids=torch.zeros(B, T, dtype=torch.long))),
                topk_divergence(**_topk()),
            ),
            lambda r: all(bool(torch.equal(a, b)) for a, b in zip(r[0], r[1], strict=True)),
        )
    )
    logits = torch.randn(B, T, V, generator=torch.Generator().manual_seed(2))
    exact_bad = {
        "shapes differ": (dict(mu_logits=torch.zeros(B, T, V + 1)), ("shape",)),
        "mu NaN": (dict(mu_logits=torch.full((B, T, V), NAN)), ("mu_logits",)),
        "pi int": (dict(pi_logits=torch.zeros(B, T, V, dtype=torch.long)), ("pi_logits",)),
        "mu None": (dict(mu_logits=None), ("mu_logits",)),
        "temperature 0": (dict(temperature=0.0), ("temperature",)),
        "temperature NaN": (dict(temperature=NAN), ("temperature",)),
        "temperature bool": (dict(temperature=True), ("temperature",)),
        "other device": (dict(mu_logits=torch.zeros(B, T, V, device="meta")), ("device",)),
        "a row of -inf": (dict(mu_logits=torch.full((B, T, V), -INF)), ("mu_logits", "-inf")),
    }
    for label, (over, words) in exact_bad.items():
        kw = {"pi_logits": logits, "mu_logits": logits.clone(), **over}
        out.append(bad(A, f"exact_divergence {label}", lambda kw=kw: exact_divergence(**kw), *words))
    out += [
        ok(
            A,
            "exact_divergence equal",
            lambda: exact_divergence(logits, logits.clone()),
            lambda r: _close(r[0], 0) and _close(r[1], 0),
        ),
        ok(
            A,
            "exact_divergence -inf logit",
            lambda: exact_divergence(
                logits.index_fill(-1, torch.tensor([0]), -INF), logits.index_fill(-1, torch.tensor([0]), -INF)
            ),
            lambda r: _close(r[0], 0),
        ),
    ]
    ids = torch.zeros(B, T, dtype=torch.long)
    from_logits_bad = {
        "k 0": (dict(k=0), ("k",)),
        "k -1": (dict(k=-1), ("k",)),
        "k above V": (dict(k=V + 1), ("k",)),
        "k float": (dict(k=2.5), ("k",)),
        "k bool": (dict(k=True), ("k",)),
        "k text": (dict(k="4"), ("k",)),
        "sampled float": (dict(sampled_ids=torch.zeros(B, T)), ("sampled_ids",)),
        "sampled out of vocab": (dict(sampled_ids=torch.full((B, T), V)), ("sampled_ids",)),
        "sampled shape": (dict(sampled_ids=torch.zeros(B, dtype=torch.long)), ("sampled_ids",)),
        "temperature 0": (dict(temperature=0), ("temperature",)),
        "logits None": (dict(logits=None), ("logits",)),
    }
    for label, (over, words) in from_logits_bad.items():
        kw = {"logits": logits, "sampled_ids": ids, "k": K, **over}
        out.append(bad(A, f"topk_from_logits {label}", lambda kw=kw: topk_from_logits(**kw), *words))
    out.append(
        ok(A, "topk_from_logits k=V", lambda: topk_from_logits(logits, ids, V), lambda r: r[0].shape == (B, T, V))
    )
    for label, (kw, words) in {
        "temperature 0": (dict(temperature=0), ("temperature",)),
        "temperature -inf": (dict(temperature=-INF), ("temperature",)),
        "temperature text": (dict(temperature="hot"), ("temperature",)),
        "logits int": (dict(logits=torch.zeros(B, T, V, dtype=torch.long)), ("logits",)),
        "logits list": (dict(logits=[[0.0, 1.0]]), ("logits",)),
        "logits NaN": (dict(logits=torch.full((B, T, V), NAN)), ("logits",)),
    }.items():
        kw = {"logits": logits, **kw}
        out.append(bad(A, f"entropy_from_logits {label}", lambda kw=kw: entropy_from_logits(**kw), *words))
    out.append(
        ok(A, "entropy uniform", lambda: entropy_from_logits(torch.zeros(B, T, V)), lambda r: _close(r, math.log(V)))
    )
    out += _rule_cases()
    return out


def _rule_cases() -> list[Case]:
    out: list[Case] = []
    evaluate_bad = {
        "rule typo": (dict(rule="dppo_binary_tvv"), ("dppo_binary_tvv",)),
        "rule upper case": (dict(rule="PPO"), ("ppo",)),
        "rule None": (dict(rule=None), ("rule",)),
        "rule number": (dict(rule=3), ("rule",)),
        "rule list": (dict(rule=["ppo"]), ("rule",)),
        "low negative": (dict(rule="ppo", low=-0.2), ("low",)),
        "low NaN": (dict(rule="ppo", low=NAN), ("low",)),
        "low text": (dict(rule="ppo", low="0.2"), ("low",)),
        "high inf": (dict(rule="ppo", high=INF), ("high",)),
        "tv bound above 1": (dict(rule="dppo_binary_tv", high=1.5), ("high",)),
        "topk_tv 1.7": (dict(rule="dppo_topk_tv", topk_tv=_lp(1.7)), ("topk_tv",)),
        "topk_tv negative": (dict(rule="dppo_topk_tv", topk_tv=_lp(-0.1)), ("topk_tv",)),
        "topk_tv NaN": (dict(rule="dppo_topk_tv", topk_tv=_lp(NAN)), ("topk_tv",)),
        "topk_kl negative": (dict(rule="dppo_topk_kl", topk_kl=_lp(-1.0)), ("topk_kl",)),
        "topk rule without topk_tv": (dict(rule="dppo_topk_tv"), ("topk_tv",)),
        "advantages shape": (dict(rule="ppo", advantages=torch.ones(B + 1)), ("advantages",)),
        "advantages NaN": (dict(rule="ppo", advantages=torch.tensor([NAN, 1.0])), ("advantages",)),
        "advantages int list": (dict(rule="ppo", advantages=[1, -1]), ("advantages",)),
        "advantages int tensor": (dict(rule="ppo", advantages=torch.tensor([1, -1])), ("advantages",)),
        "pi_logp positive": (dict(rule="ppo", pi_logp=_lp(0.3)), ("pi_logp",)),
        "mu_logp shape": (dict(rule="ppo", mu_logp=_lp(-1.0, (B, T + 1))), ("mu_logp",)),
        "old_logp shape": (dict(rule="ppo", old_logp=_lp(-1.0, (B, T + 1))), ("old_logp",)),
        "old_logp other device": (dict(rule="ppo", old_logp=torch.zeros(B, T, device="meta")), ("old_logp", "device")),
        "topk_tv other device": (
            dict(rule="dppo_topk_tv", topk_tv=torch.zeros(B, T, device="meta")),
            ("topk_tv", "device"),
        ),
    }
    for label, (over, words) in evaluate_bad.items():
        kw = {**_inputs(), **over}
        out.append(bad(A, f"evaluate {label}", lambda kw=kw: evaluate(**kw), *words))
    out += [
        ok(
            A,
            "evaluate ppo on-policy",
            lambda: evaluate("ppo", **_inputs(mu_logp=_lp(-1.0))),
            lambda r: not bool(r.any()),
        ),
        ok(
            A,
            "evaluate -inf logps",
            lambda: evaluate("ppo", **_inputs(pi_logp=_lp(-INF), mu_logp=_lp(-INF))),
            lambda r: r.shape == (B, T),
        ),
        ok(
            A,
            "evaluate topk_tv exactly 1",
            lambda: evaluate("dppo_topk_tv", **_inputs(topk_tv=_lp(1.0))),
            lambda r: bool(r.any()),
        ),
        ok(
            A,
            "evaluate per-token advantages",
            lambda: evaluate("ppo", **_inputs(advantages=torch.ones(B, T))),
            lambda r: r.shape == (B, T),
        ),
        ok(
            A,
            "evaluate zero advantages",
            lambda: evaluate("ppo", **_inputs(mu_logp=_lp(-3.0), advantages=torch.zeros(B))),
            lambda r: r.shape == (B, T),
        ),
    ]
    for label, (rules, words) in {
        "unknown": (["ppo", "ppoo"], ("ppoo",)),
        "repeated": (["ppo", "ppo"], ("ppo",)),
        "a number": (3, ("rules",)),
        "None in the list": (["ppo", None], ("rule",)),
        "a dict of text": ({"ppo": "wide"}, ("ppo",)),
    }.items():
        out.append(bad(A, f"evaluate_all {label}", lambda rules=rules: evaluate_all(rules, **_inputs()), *words))
    out.append(
        ok(
            A,
            "evaluate_all two rules",
            lambda: evaluate_all(["ppo", "cispo"], **_inputs()),
            lambda r: set(r) == {"ppo", "cispo"},
        )
    )
    out.append(
        ok(
            A,
            "evaluate_all no rules (as the recorder's rules=[])",
            lambda: evaluate_all([], **_inputs()),
            lambda r: r == {},
        )
    )
    loss_bad = {
        "response_mask of 2": (dict(response_mask=torch.full((B, T), 2.0)), ("response_mask",)),
        "response_mask shape": (dict(response_mask=torch.ones(B, T + 1)), ("response_mask",)),
        "response_mask list": (dict(response_mask=[[1, 1, 1]] * B), ("response_mask",)),
        "loss_agg_mode typo": (dict(loss_agg_mode="token_mean"), ("loss_agg_mode",)),
        "loss_agg_mode None": (dict(loss_agg_mode=None), ("loss_agg_mode",)),
        "clip_ratio_c 0": (dict(clip_ratio_c=0.0), ("clip_ratio_c",)),
        "clip_ratio_c -1": (dict(clip_ratio_c=-1.0), ("clip_ratio_c",)),
        "clip_ratio_c NaN": (dict(clip_ratio_c=NAN), ("clip_ratio_c",)),
        "clip_ratio_c text": (dict(clip_ratio_c="10"), ("clip_ratio_c",)),
        "rule typo": (dict(rule="grpo"), ("grpo",)),
        "pi_logp NaN": (dict(pi_logp=_lp(NAN)), ("pi_logp",)),
        "high negative": (dict(high=-0.1), ("high",)),
        "mask other device": (dict(response_mask=torch.ones(B, T, device="meta")), ("response_mask", "device")),
    }
    for label, (over, words) in loss_bad.items():
        kw = {"rule": "ppo", **_inputs(), "response_mask": torch.ones(B, T), **over}
        out.append(bad(A, f"policy_loss {label}", lambda kw=kw: policy_loss(**kw), *words))
    out += [
        ok(
            A,
            "policy_loss all masked",
            lambda: policy_loss("ppo", **_inputs(), response_mask=torch.zeros(B, T)),
            lambda r: bool(torch.isfinite(r.loss)) and float(r.loss) == 0.0,
        ),
        ok(
            A,
            "policy_loss on-policy",
            lambda: policy_loss("ppo", **_inputs(mu_logp=_lp(-1.0)), response_mask=torch.ones(B, T)),
            lambda r: abs(float(r.loss)) < 1e-6 and float(r.blocked_frac) == 0.0,
        ),
    ]
    for label, value, words in [
        ("typo", "cispoo", ("cispoo",)),
        ("None", None, ("rule",)),
        ("empty", "", ("rule",)),
        ("number", 1, ("rule",)),
    ]:
        out.append(bad(A, f"get_rule {label}", lambda value=value: get_rule(value), *words))
    return out
