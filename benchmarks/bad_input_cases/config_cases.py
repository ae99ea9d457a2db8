"""The configuration dataclasses: CollapseConfig, TrainConfig, Keep and Rule, each field out of
its domain (the field's name must be in the error)."""

from __future__ import annotations

from bad_input_cases import INF, NAN, Case, Fixtures, bad, ok
from trustlens import Keep, Rule
from trustlens.analysis import CollapseConfig
from trustlens.train.config import TrainConfig

A = "config"

COLLAPSE = {
    "baseline_steps": (0, -1, 2.5, "5"),
    "baseline_start": (-1, 1.0),
    "merge_gap": (-5, 0, 1.5),
    "reward_window": (0, NAN),
    "smooth": (0, 1.5, True),
    "accuracy_evals": (0, 2.0),
    "top_tokens": (-1, None),
    "top_samples": (-1, 3.5),
    "z_warning": (-1.0, NAN, INF, "3"),
    "rel_floor": (-0.1, NAN),
    "entropy_drop": (0, 1, 1.5, NAN),
    "reward_drop": (0, -0.1, NAN),
    "reward_critical": (1.5, NAN),
    "accuracy_drop": (0, 1),
    "entropy_surge": (0, -0.25, INF),
    "blocked_drift": (-0.01, 1.5),
    "mismatch_growth": (1, 0.5, NAN),
    "grad_spike": (1, INF),
    "blocked_factor": (0, -2),
    "mismatch_k3_level": (0, -1e-3, NAN),
}
TRAIN = {
    "temperature": (0, -1.0, INF, NAN),
    "lr": (0, -1e-5, INF, NAN),
    "grad_clip": (0, NAN),
    "clip_ratio_c": (0, INF),
    "logit_noise": (-0.1, NAN, INF),
    "weight_decay": (-0.1, NAN),
    "tv_bound": (0, 1, 1.5, NAN),
    "steps": (0, 2.5, -1),
    "prompts_per_step": (0, 2.5),
    "minibatches": (0, 1000, 2.5),
    "epochs": (0, 2.5),
    "seed": (2.5, "0"),
    "topk": (0, 2.5),
    "eval_size": (2.5, -1),
    "eval_every": (0,),
    "threads": (0, -1),
    "group_size": (1, 0),
    "max_new_tokens": (0, -1, 2.5),
    "rollout_lag": (-1, 0.5),
    "sample_every": (0, -1),
    "low": (-0.2, NAN, "0.2"),
    "high": (-1.0, INF),
    "loss_agg_mode": ("sum", None),
    "rollout_precision": ("fp16", "BF16"),
    "engine": ("sentinell", None),
    "keep_rate": (0, 1.5, NAN),
    "partial_credit": (1.0, -0.1),
    "scale_advantages": ("yes",),
    "record": ("no",),
    "checkpoint": ("",),
    "mirror": (3,),
}


def cases(fx: Fixtures) -> list[Case]:
    out: list[Case] = []
    for field, values in COLLAPSE.items():
        for v in values:
            out.append(bad(A, f"CollapseConfig {field}={v!r}", lambda f=field, v=v: CollapseConfig(**{f: v}), field))
    for field, values in TRAIN.items():
        for v in values:
            out.append(bad(A, f"TrainConfig {field}={v!r}", lambda f=field, v=v: TrainConfig(**{f: v}), field))
    out.append(bad(A, "TrainConfig rule typo", lambda: TrainConfig(rule="dppo_binary_tvv"), "dppo_binary_tvv"))
    out.append(bad(A, "TrainConfig rule None", lambda: TrainConfig(rule=None), "rule"))
    for field, values in {
        "rate": (0, 1.5, -0.1, NAN, "0.1"),
        "seed": (-1, 1.5),
        "low_mu": (-0.1, 1.5, NAN),
        "top_share": (-0.01, 2.0),
    }.items():
        for v in values:
            out.append(bad(A, f"Keep {field}={v!r}", lambda f=field, v=v: Keep(**{f: v}), field))
    base = dict(name="mine", low=0.2, high=0.2, anchor="mu", measure="ratio", description="")
    for field, v in [
        ("name", ""),
        ("name", None),
        ("low", -0.2),
        ("low", NAN),
        ("high", INF),
        ("high", "0.2"),
        ("anchor", "pi"),
        ("measure", "ratoi"),
        ("weight", "clip"),
        ("tis_cap", 2.0),
        ("description", None),
    ]:
        out.append(bad(A, f"Rule {field}={v!r}", lambda f=field, v=v: Rule(**{**base, f: v}), field))
    out.append(bad(A, "Rule tis_cap 0", lambda: Rule(**{**base, "weight": "tis", "tis_cap": 0.0}), "tis_cap"))
    out += [
        ok(
            A,
            "CollapseConfig edges",
            lambda: CollapseConfig(baseline_steps=1, baseline_start=0, merge_gap=1, top_tokens=0),
            lambda c: c.merge_gap == 1,
        ),
        ok(A, "TrainConfig defaults", lambda: TrainConfig(), lambda c: c.temperature == 0.5),
        ok(
            A,
            "TrainConfig numpy int steps",
            lambda: TrainConfig(steps=__import__("numpy").int64(3)),
            lambda c: c.steps == 3,
        ),
        ok(A, "Keep rate 1", lambda: Keep(rate=1.0), lambda k: k.rate == 1.0),
        ok(
            A,
            "Rule no measure",
            lambda: Rule(name="plain", low=None, high=None, anchor="mu", measure=None, description="x"),
            lambda r: r.low is None,
        ),
    ]
    return out
