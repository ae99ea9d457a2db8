"""The analyses: every function of trustlens.analysis.__all__ given the wrong kind of object, a
rule name with a typo, a column that is not there and numbers outside their domain."""

from __future__ import annotations

import polars as pl

from bad_input_cases import NAN, Case, Fixtures, bad, ok
from trustlens import analysis, load_run

A = "analyses"
# analyses whose first argument is a Run or its token rows (the word its error names)
ROW_FIRST = {
    "blocked_anchor_quantiles": "tokens",
    "blocked_by_advantage_sign": "tokens",
    "blocked_by_bucket": "tokens",
    "blocked_by_token": "tokens",
    "blocked_per_step": "tokens",
    "blocked_token_anchor": "tokens",
    "confusion_matrix": "tokens",
    "figure1_density": "tokens",
    "mismatch_by_bucket": "tokens",
    "mismatch_per_step": "tokens",
    "mismatch_unavailable": "tokens",
    "motivating_examples": "tokens",
    "over_updates_per_step": "tokens",
    "step_summary": "tokens",
    "threshold_sweep": "tokens",
    "detect_collapse": "run",
    "step_signals": "run",
    "exact_aggregates": "run",
    "doctor": "run",
}
EXTRA = {"rule_confusion": ("ppo", "dppo_binary_tv"), "with_rules": (["ppo"],)}
ROW_FIRST |= {"rule_confusion": "tokens", "with_rules": "tokens"}
WRONG = {
    "a path": "runs/ppo",
    "None": None,
    "a DataFrame": pl.DataFrame({"step": [0]}),
    "a dict": {"tokens": []},
    "a number": 3,
    "a list of runs": [],
}


def cases(fx: Fixtures) -> list[Case]:
    run = load_run(fx.good)
    rows = run.tokens
    out: list[Case] = []
    for name, word in ROW_FIRST.items():
        fn = getattr(analysis, name)
        extra = EXTRA.get(name, ())
        for label, value in WRONG.items():
            out.append(bad(A, f"{name} {label}", lambda fn=fn, value=value, extra=extra: fn(value, *extra), word))
    for name in ("detect_collapse", "step_signals"):
        fn = getattr(analysis, name)
        out.append(bad(A, f"{name} the token rows", lambda fn=fn: fn(rows), name, "run"))
    # rule names: a typo, one the run did not record, a number
    rule_calls = {
        "blocked_per_step": lambda r: analysis.blocked_per_step(run, r),
        "blocked_by_token": lambda r: analysis.blocked_by_token(run, r),
        "blocked_by_bucket": lambda r: analysis.blocked_by_bucket(run, r),
        "blocked_by_advantage_sign": lambda r: analysis.blocked_by_advantage_sign(run, r),
        "blocked_anchor_quantiles": lambda r: analysis.blocked_anchor_quantiles(run, r),
        "blocked_token_anchor": lambda r: analysis.blocked_token_anchor(run, r),
        "confusion_matrix": lambda r: analysis.confusion_matrix(run, [r, "ppo"]),
        "rule_confusion": lambda r: analysis.rule_confusion(run, r, "ppo"),
        "over_updates_per_step": lambda r: analysis.over_updates_per_step(run, r),
        "motivating_examples": lambda r: analysis.motivating_examples(run, r),
        "threshold_sweep": lambda r: analysis.threshold_sweep(run, r),
        "with_rules": lambda r: analysis.with_rules(run, [r]).collect(),
        "detect_collapse": lambda r: analysis.detect_collapse(run, rule=r),
        "figure1_density": lambda r: analysis.figure1_density(run, rules=[r]),
    }
    for name, call in rule_calls.items():
        for label, value, words in [
            ("rule typo", "ppoo", ("ppoo",)),
            ("rule upper case", "PPO", ("PPO",)),
            ("rule a number", 7, ("rule",)),
        ]:
            out.append(bad(A, f"{name} {label}", lambda call=call, value=value: call(value), *words))
    out += _domain_cases(run)
    out += _valid_cases(fx, run)
    return out


def _domain_cases(run) -> list[Case]:
    per_step = analysis.mismatch_per_step(run)
    outcomes = pl.DataFrame({"rule": ["ppo"], "seed": [0], "final_accuracy": [0.5]})
    domain = {
        "blocked_by_bucket min_p 0": (lambda: analysis.blocked_by_bucket(run, min_p=0), ("min_p",)),
        "blocked_by_bucket min_p 2": (lambda: analysis.blocked_by_bucket(run, min_p=2.0), ("min_p",)),
        "blocked_by_bucket min_p NaN": (lambda: analysis.blocked_by_bucket(run, min_p=NAN), ("min_p",)),
        "blocked_by_bucket per_decade 0": (lambda: analysis.blocked_by_bucket(run, per_decade=0), ("per_decade",)),
        "blocked_by_bucket per_decade 1.5": (lambda: analysis.blocked_by_bucket(run, per_decade=1.5), ("per_decade",)),
        "mismatch_by_bucket min_p -1": (lambda: analysis.mismatch_by_bucket(run, min_p=-1.0), ("min_p",)),
        "mismatch_by_bucket per_decade -2": (lambda: analysis.mismatch_by_bucket(run, per_decade=-2), ("per_decade",)),
        "bucket_table min_p 0": (lambda: analysis.bucket_table(min_p=0), ("min_p",)),
        "bucket_table min_p 1.5": (lambda: analysis.bucket_table(min_p=1.5), ("min_p",)),
        "bucket_table min_p text": (lambda: analysis.bucket_table(min_p="1e-6"), ("min_p",)),
        "bucket_table per_decade 0": (lambda: analysis.bucket_table(per_decade=0), ("per_decade",)),
        "bucket_table per_decade 10**9": (lambda: analysis.bucket_table(per_decade=10**9), ("per_decade",)),
        "blocked_by_token top 0": (lambda: analysis.blocked_by_token(run, top=0), ("top",)),
        "blocked_by_token top -1": (lambda: analysis.blocked_by_token(run, top=-1), ("top",)),
        "blocked_by_token top 2.5": (lambda: analysis.blocked_by_token(run, top=2.5), ("top",)),
        "blocked_by_token min_count 0": (lambda: analysis.blocked_by_token(run, min_count=0), ("min_count",)),
        "blocked_token_anchor top -1": (lambda: analysis.blocked_token_anchor(run, top=-1), ("top",)),
        "blocked_token_anchor min_count -1": (lambda: analysis.blocked_token_anchor(run, min_count=-1), ("min_count",)),
        "blocked_anchor_quantiles 1.5": (
            lambda: analysis.blocked_anchor_quantiles(run, quantiles=[1.5]),
            ("quantiles",),
        ),
        "blocked_anchor_quantiles NaN": (
            lambda: analysis.blocked_anchor_quantiles(run, quantiles=[NAN]),
            ("quantiles",),
        ),
        "blocked_anchor_quantiles a number": (
            lambda: analysis.blocked_anchor_quantiles(run, quantiles=0.5),
            ("quantiles",),
        ),
        "blocked_anchor_quantiles empty": (
            lambda: analysis.blocked_anchor_quantiles(run, quantiles=[]),
            ("quantiles",),
        ),
        "figure1_density y typo": (lambda: analysis.figure1_density(run, y="ratoi"), ("ratoi",)),
        "figure1_density n_x 0": (lambda: analysis.figure1_density(run, n_x=0), ("n_x",)),
        "figure1_density n_y -3": (lambda: analysis.figure1_density(run, n_y=-3), ("n_y",)),
        "figure1_density n_x 2.5": (lambda: analysis.figure1_density(run, n_x=2.5), ("n_x",)),
        "figure1_density y_range reversed": (lambda: analysis.figure1_density(run, y_range=(2.0, 0.0)), ("y_range",)),
        "figure1_density y_range NaN": (lambda: analysis.figure1_density(run, y_range=(NAN, 1.0)), ("y_range",)),
        "figure1_density y_range one number": (lambda: analysis.figure1_density(run, y_range=1.0), ("y_range",)),
        "figure1_density min_p 0": (lambda: analysis.figure1_density(run, min_p=0.0), ("min_p",)),
        "motivating_examples n 0": (lambda: analysis.motivating_examples(run, n=0), ("n",)),
        "motivating_examples n -1": (lambda: analysis.motivating_examples(run, n=-1), ("n",)),
        "motivating_examples near_certain 1.5": (
            lambda: analysis.motivating_examples(run, near_certain=1.5),
            ("near_certain",),
        ),
        "motivating_examples near_certain 0": (
            lambda: analysis.motivating_examples(run, near_certain=0.0),
            ("near_certain",),
        ),
        "rule_confusion per_step text": (
            lambda: analysis.rule_confusion(run, "ppo", "dppo_binary_tv", per_step="no"),
            ("per_step",),
        ),
        "step_summary columns typo": (lambda: analysis.step_summary(run, columns=("ratoi",)), ("ratoi",)),
        "step_summary columns a string": (lambda: analysis.step_summary(run, columns="ratio"), ("columns",)),
        "step_summary aggregates a DataFrame": (
            lambda: analysis.step_summary(run.tokens, aggregates=pl.DataFrame()),
            ("aggregates",),
        ),
        "mismatch_per_step aggregates a path": (
            lambda: analysis.mismatch_per_step(run.tokens, aggregates="x"),
            ("aggregates",),
        ),
        "blocked_per_step aggregates a number": (
            lambda: analysis.blocked_per_step(run.tokens, aggregates=3),
            ("aggregates",),
        ),
        "threshold_sweep scales empty": (lambda: analysis.threshold_sweep(run, "ppo", scales=[]), ("scales",)),
        "threshold_sweep scales negative": (lambda: analysis.threshold_sweep(run, "ppo", scales=[-1.0]), ("scales",)),
        "threshold_sweep scales NaN": (lambda: analysis.threshold_sweep(run, "ppo", scales=[NAN]), ("scales",)),
        "threshold_sweep scales 0": (lambda: analysis.threshold_sweep(run, "ppo", scales=[0.0]), ("scales",)),
        "threshold_sweep scales a number": (lambda: analysis.threshold_sweep(run, "ppo", scales=2.0), ("scales",)),
        "threshold_sweep batch_rows 0": (lambda: analysis.threshold_sweep(run, "ppo", batch_rows=0), ("batch_rows",)),
        "threshold_sweep min_p 0": (
            lambda: analysis.threshold_sweep(run, "ppo", by_bucket=True, min_p=0.0),
            ("min_p",),
        ),
        "threshold_sweep base unknown rule": (
            lambda: analysis.threshold_sweep(run, "ppo", base={"ppoo": {"low": 0.2}}),
            ("ppoo",),
        ),
        "threshold_sweep base a number": (lambda: analysis.threshold_sweep(run, "ppo", base={"ppo": 0.2}), ("ppo",)),
        "with_rules a string": (lambda: analysis.with_rules(run, "ppo").collect(), ("rules",)),
        "exact_aggregates steps reversed": (lambda: analysis.exact_aggregates(run, steps=(5, 1)), ("steps",)),
        "exact_aggregates steps a number": (lambda: analysis.exact_aggregates(run, steps=3), ("steps",)),
        "exact_aggregates steps negative": (lambda: analysis.exact_aggregates(run, steps=(-2, 1)), ("steps",)),
        "detect_collapse config a dict": (lambda: analysis.detect_collapse(run, {"merge_gap": 3}), ("config",)),
        "detect_collapse signals a LazyFrame": (
            lambda: analysis.detect_collapse(run, signals=pl.LazyFrame()),
            ("signals",),
        ),
        "detect_collapse signals without step": (
            lambda: analysis.detect_collapse(run, signals=pl.DataFrame({"x": [1.0]})),
            ("signals", "step"),
        ),
        "mismatch_trend not a DataFrame": (lambda: analysis.mismatch_trend(None, ["k3_kl"]), ("per_step",)),
        "mismatch_trend metric typo": (lambda: analysis.mismatch_trend(per_step, ["k3_kll"]), ("k3_kll",)),
        "mismatch_trend metrics a string": (lambda: analysis.mismatch_trend(per_step, "k3_kl"), ("metrics",)),
        "mismatch_trend window 0": (lambda: analysis.mismatch_trend(per_step, ["k3_kl"], window=0), ("window",)),
        "mismatch_trend window 1.5": (lambda: analysis.mismatch_trend(per_step, ["k3_kl"], window=1.5), ("window",)),
        "mismatch_trend no step column": (
            lambda: analysis.mismatch_trend(pl.DataFrame({"k3_kl": [1.0]}), ["k3_kl"]),
            ("step",),
        ),
        "collapse_onset window 0": (lambda: analysis.collapse_onset([(0, 0.5)], [(0, 1.0)], window=0), ("window",)),
        "collapse_onset accuracy numbers": (lambda: analysis.collapse_onset([0.5, 0.4], [(0, 1.0)]), ("accuracy",)),
        "collapse_onset accuracy None": (lambda: analysis.collapse_onset(None, [(0, 1.0)]), ("accuracy",)),
        "collapse_onset reward a DataFrame": (
            lambda: analysis.collapse_onset([(0, 0.5)], pl.DataFrame({"step": [0]})),
            ("reward",),
        ),
        "collapse_onset accuracy NaN": (
            lambda: analysis.collapse_onset([(0, NAN), (1, 0.1)], [(0, 1.0)]),
            ("accuracy",),
        ),
        "rule_boundaries typo": (lambda: analysis.rule_boundaries(["ppoo"]), ("ppoo",)),
        "rule_boundaries a string": (lambda: analysis.rule_boundaries("ppo"), ("rules",)),
        "rule_boundaries n 0": (lambda: analysis.rule_boundaries(["ppo"], n=0), ("n",)),
        "rule_boundaries min_p 0": (lambda: analysis.rule_boundaries(["ppo"], min_p=0.0), ("min_p",)),
        "rule_boundaries low text": (lambda: analysis.rule_boundaries({"ppo": {"low": "0.2"}}), ("low",)),
        "rule_boundaries low negative": (lambda: analysis.rule_boundaries({"ppo": {"low": -0.2}}), ("low",)),
        "rule_boundaries unknown field": (lambda: analysis.rule_boundaries({"ppo": {"lo": 0.2}}), ("lo",)),
        "run_outcomes a path": (lambda: analysis.run_outcomes("runs"), ("runs",)),
        "run_outcomes None": (lambda: analysis.run_outcomes(None), ("runs",)),
        "run_outcomes a list of paths": (lambda: analysis.run_outcomes(["runs/ppo"]), ("runs",)),
        "run_outcomes one Run": (lambda: analysis.run_outcomes(run), ("runs",)),
        "seed_table by typo": (lambda: analysis.seed_table(outcomes, by="rul"), ("rul",)),
        "seed_table a list": (lambda: analysis.seed_table([1, 2]), ("outcomes",)),
        "seed_table None": (lambda: analysis.seed_table(None), ("outcomes",)),
        "CollapseConfig a field typo": (lambda: analysis.CollapseConfig(merge_gpa=3), ("merge_gpa",)),
    }
    return [bad(A, label, call, *words) for label, (call, words) in domain.items()]


def _valid_cases(fx: Fixtures, run) -> list[Case]:
    empty = run.tokens.filter(pl.col("step") > 999)
    return [
        ok(A, "step_summary the run", lambda: analysis.step_summary(run), lambda t: t.height == 6),
        ok(A, "step_summary an empty filter", lambda: analysis.step_summary(empty), lambda t: t.height == 0),
        ok(A, "blocked_per_step an empty filter", lambda: analysis.blocked_per_step(empty), lambda t: t.height == 0),
        ok(A, "mismatch_per_step an empty filter", lambda: analysis.mismatch_per_step(empty), lambda t: t.height == 0),
        ok(A, "blocked_by_token top 1", lambda: analysis.blocked_by_token(run, "ppo", top=1), lambda t: t.height <= 1),
        ok(
            A,
            "bucket_table per_decade 2",
            lambda: analysis.bucket_table(min_p=1e-2, per_decade=2),
            lambda t: t.height >= 4,
        ),
        ok(
            A,
            "rule_confusion overall (per_step False)",
            lambda: analysis.rule_confusion(run, "ppo", "dppo_binary_tv", per_step=False),
            lambda t: t.height >= 1,
        ),
        ok(
            A,
            "rule_confusion a rule with itself (all agree)",
            lambda: analysis.rule_confusion(run, "ppo", "ppo", per_step=False),
            lambda t: t["only_a"].item() == t["only_b"].item() == 0 and t["agreement"].item() == 1.0,
        ),
        ok(A, "doctor the token rows", lambda: analysis.doctor(run.tokens), lambda r: len(r) > 0),
        ok(A, "mismatch_unavailable the run", lambda: analysis.mismatch_unavailable(run), lambda r: r is None),
        ok(
            A,
            "collapse_onset no collapse",
            lambda: analysis.collapse_onset([(0, 0.5), (10, 0.6)], [(0, 1.0), (10, 1.0)]),
            lambda r: r == (None, None),
        ),
        ok(A, "collapse_onset empty", lambda: analysis.collapse_onset([], []), lambda r: r == (None, None)),
        ok(
            A,
            "rule_boundaries a mapping",
            lambda: analysis.rule_boundaries({"ppo": {"low": 0.1, "high": 0.1}}),
            lambda t: t.height > 0,
        ),
        ok(A, "detect_collapse the run", lambda: analysis.detect_collapse(run), lambda t: isinstance(t, pl.DataFrame)),
        ok(
            A,
            "threshold_sweep one scale",
            lambda: analysis.threshold_sweep(run, "ppo", scales=[1.0]),
            lambda t: t.height >= 1,
        ),
        ok(
            A,
            "figure1_density y_range",
            lambda: analysis.figure1_density(run, y_range=(0.0, 2.0)),
            lambda t: t.height > 0,
        ),
        ok(A, "run_outcomes no runs", lambda: analysis.run_outcomes([]), lambda t: t.height == 0),
        ok(A, "exact_aggregates unsampled run", lambda: analysis.exact_aggregates(run), lambda r: r is None),
        ok(A, "CollapseConfig z_warning 0", lambda: analysis.CollapseConfig(z_warning=0), lambda c: c.z_warning == 0),
    ]
