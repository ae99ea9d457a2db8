"""Bad inputs to the analyses: CollapseConfig's fields, a rule the run did not record, the wrong
kind of object where a Run or its token rows are expected (issue 32), TokenQuery fields of the
wrong kind or shape and another table where the aggregates belong (issue 39). Each case asserts
the error type and that the message names the argument."""

from __future__ import annotations

import math
import re

import polars as pl
import pytest

from trustlens import analysis
from trustlens.analysis.collapse import CollapseConfig, detect_collapse
from trustlens.analysis.tokens import TokenQuery
from trustlens.run import load_run
from trustlens.run.tables import write_run

NAN, INF = math.nan, math.inf

CONFIG_CASES = [
    *[("baseline_steps", v, e) for v, e in [(0, ValueError), (-1, ValueError), (2.5, TypeError), ("5", TypeError)]],
    *[("baseline_start", v, e) for v, e in [(-1, ValueError), (1.0, TypeError)]],
    *[("merge_gap", v, e) for v, e in [(-5, ValueError), (0, ValueError), (1.5, TypeError)]],
    *[("reward_window", v, e) for v, e in [(0, ValueError), (NAN, TypeError)]],
    *[("smooth", v, e) for v, e in [(0, ValueError), (1.5, TypeError), (True, TypeError)]],
    *[("accuracy_evals", v, e) for v, e in [(0, ValueError), (2.0, TypeError)]],
    *[("top_tokens", v, e) for v, e in [(-1, ValueError), (None, TypeError)]],
    *[("top_samples", v, e) for v, e in [(-1, ValueError), (3.5, TypeError)]],
    *[("z_warning", v, e) for v, e in [(-1.0, ValueError), (NAN, ValueError), (INF, ValueError), ("3", TypeError)]],
    *[("rel_floor", v, e) for v, e in [(-0.1, ValueError), (NAN, ValueError)]],
    *[
        (f, v, ValueError)
        for f in ("entropy_drop", "reward_drop", "reward_critical", "accuracy_drop")
        for v in (0, 1, -0.1, 1.5, NAN)
    ],
    *[("entropy_surge", v, ValueError) for v in (0, -0.25, NAN, INF)],
    *[("blocked_drift", v, ValueError) for v in (-0.01, 1.5, NAN)],
    *[
        (f, v, ValueError)
        for f in ("mismatch_growth", "grad_spike", "blocked_factor")
        for v in (1, 0.5, 0, -2, NAN, INF)
    ],
    *[("mismatch_k3_level", v, ValueError) for v in (0, -1e-3, NAN)],
]


@pytest.mark.parametrize(("field", "value", "error"), CONFIG_CASES)
def test_collapse_config_names_the_field(field, value, error):
    with pytest.raises(error, match=f"^{field}"):
        CollapseConfig(**{field: value})


def test_collapse_config_accepts_its_edges():
    CollapseConfig(baseline_steps=1, baseline_start=0, merge_gap=1, top_tokens=0, z_warning=0, blocked_drift=1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = write_run(
        tmp_path_factory.mktemp("bad") / "run",
        tokens={
            "step": [0, 1, 2],
            "sample": [0, 1, 2],
            "pos": [0, 0, 0],
            "pi_logp": [-1.0, -1.0, -1.0],
            "mu_logp": [-1.1, -1.0, -0.9],
            "advantage": [1.0, -1.0, 0.0],
            "blocked_ppo": [False, True, False],
            "blocked_cispo": [False, False, False],
        },
    )
    return load_run(path)


def test_a_rule_the_run_did_not_record_is_named(run):
    with pytest.raises(ValueError, match=r"rule must be one of ppo, cispo; got 'cispoo' \(did you mean 'cispo'\?\)"):
        detect_collapse(run, rule="cispoo")
    with pytest.raises(ValueError, match="rule must be one of"):
        detect_collapse(run, rule="dppo_binary_tv")  # a known rule, not recorded: it would watch nothing
    with pytest.raises(TypeError, match="config must be a CollapseConfig"):
        detect_collapse(run, {"merge_gap": 3})


# analyses over token rows: a Run or a LazyFrame; anything else names the argument
ROW_ANALYSES = {  # name -> its other positional arguments
    "step_summary": (),
    "blocked_per_step": (),
    "mismatch_per_step": (),
    "rule_confusion": ("ppo", "cispo"),
    "threshold_sweep": (),
}
# analyses that need the Run itself
RUN_ANALYSES = ["detect_collapse", "step_signals"]
WRONG = {
    "a path": "runs/ppo",
    "None": None,
    "a DataFrame": pl.DataFrame({"step": [0]}),
    "a dict": {"tokens": []},
    "a number": 3,
}


@pytest.mark.parametrize("function", list(ROW_ANALYSES))
@pytest.mark.parametrize("given", list(WRONG))
def test_row_analyses_name_what_they_were_given(function, given):
    with pytest.raises(TypeError, match=rf"{function}: tokens must be a Run"):
        getattr(analysis, function)(WRONG[given], *ROW_ANALYSES[function])


@pytest.mark.parametrize("function", RUN_ANALYSES)
@pytest.mark.parametrize("given", [*WRONG, "token rows"])
def test_run_analyses_name_what_they_were_given(function, given, run):
    value = run.tokens if given == "token rows" else WRONG[given]
    with pytest.raises(TypeError, match=rf"{function}: run must be"):
        getattr(analysis, function)(value)


@pytest.mark.parametrize("function", list(ROW_ANALYSES))
def test_row_analyses_accept_the_run_and_its_rows(function, run):
    of_run = getattr(analysis, function)(run, *ROW_ANALYSES[function])
    of_rows = getattr(analysis, function)(run.tokens, *ROW_ANALYSES[function])
    assert type(of_run) is type(of_rows)


def test_valid_analysis_edge_cases(run):
    summary = analysis.step_summary(run.tokens.filter(pl.col("step") > 99))  # an empty filter: no steps
    assert summary.height == 0
    blocked = analysis.blocked_per_step(run).filter(pl.col("rule") == "ppo").sort("step")
    assert blocked["blocked"].to_list() == [0, 1, 0]


@pytest.mark.parametrize("given", list(WRONG))
def test_exact_aggregates_and_doctor_name_what_they_were_given(given):
    with pytest.raises(TypeError, match="exact_aggregates: run must be"):
        analysis.exact_aggregates(WRONG[given])
    if given != "a path":  # doctor loads a path
        with pytest.raises(TypeError, match="doctor: run must be"):
            analysis.doctor(WRONG[given])


@pytest.mark.parametrize("steps", [(5, 1), 3, (-2, 1)])
def test_exact_aggregates_names_its_steps(run, steps):
    with pytest.raises((TypeError, ValueError), match=r"^steps"):
        analysis.exact_aggregates(run, steps=steps)


@pytest.mark.parametrize("function", ["blocked_per_step", "blocked_by_token", "blocked_anchor_quantiles"])
def test_a_rule_that_is_not_a_name_is_named(run, function):
    with pytest.raises(TypeError, match=r"^rules"):
        getattr(analysis, function)(run, 7)


# (call on the run, error type, the argument its message names): numbers, lists and tables given
# to the analyses, each refused at the entry
DOMAIN_CASES = {
    "bucket_table min_p text": (lambda run: analysis.bucket_table(min_p="1e-6"), TypeError, "min_p"),
    "bucket_table per_decade 10**9": (lambda run: analysis.bucket_table(per_decade=10**9), ValueError, "per_decade"),
    "bucket_table per_decade 1.5": (lambda run: analysis.bucket_table(per_decade=1.5), TypeError, "per_decade"),
    "blocked_by_token top 0": (lambda run: analysis.blocked_by_token(run, top=0), ValueError, "top"),
    "blocked_by_token top -1": (lambda run: analysis.blocked_by_token(run, top=-1), ValueError, "top"),
    "blocked_by_token top 2.5": (lambda run: analysis.blocked_by_token(run, top=2.5), TypeError, "top"),
    "blocked_by_token min_count 0": (lambda run: analysis.blocked_by_token(run, min_count=0), ValueError, "min_count"),
    "blocked_token_anchor top -1": (lambda run: analysis.blocked_token_anchor(run, top=-1), ValueError, "top"),
    "blocked_token_anchor min_count -1": (
        lambda run: analysis.blocked_token_anchor(run, min_count=-1),
        ValueError,
        "min_count",
    ),
    "quantiles a number": (lambda run: analysis.blocked_anchor_quantiles(run, quantiles=0.5), TypeError, "quantiles"),
    "quantiles empty": (lambda run: analysis.blocked_anchor_quantiles(run, quantiles=[]), ValueError, "quantiles"),
    "quantiles 1.5": (lambda run: analysis.blocked_anchor_quantiles(run, quantiles=[1.5]), ValueError, "quantiles"),
    "figure1_density n_x 2.5": (lambda run: analysis.figure1_density(run, n_x=2.5), TypeError, "n_x"),
    "figure1_density n_y 0": (lambda run: analysis.figure1_density(run, n_y=0), ValueError, "n_y"),
    "figure1_density min_p 0": (lambda run: analysis.figure1_density(run, min_p=0.0), ValueError, "min_p"),
    "figure1_density y typo": (lambda run: analysis.figure1_density(run, y="pi_logpp"), ValueError, "y"),
    "figure1_density y_range one number": (
        lambda run: analysis.figure1_density(run, y="pi_logp", y_range=1.0),
        TypeError,
        "y_range",
    ),
    "figure1_density y_range reversed": (
        lambda run: analysis.figure1_density(run, y="pi_logp", y_range=(2.0, 0.0)),
        ValueError,
        "y_range",
    ),
    "motivating_examples near_certain 0": (
        lambda run: analysis.motivating_examples(run, "ppo", "cispo", near_certain=0.0),
        ValueError,
        "near_certain",
    ),
    "rule_confusion per_step text": (
        lambda run: analysis.rule_confusion(run, "ppo", "cispo", per_step="no"),
        TypeError,
        "per_step",
    ),
    "step_summary columns typo": (lambda run: analysis.step_summary(run, columns=("ratoi",)), ValueError, "columns"),
    "step_summary columns a string": (lambda run: analysis.step_summary(run, columns="tokens"), TypeError, "columns"),
    "step_summary aggregates a DataFrame": (
        lambda run: analysis.step_summary(run.tokens, aggregates=pl.DataFrame()),
        TypeError,
        "aggregates",
    ),
    "blocked_per_step aggregates a number": (
        lambda run: analysis.blocked_per_step(run.tokens, aggregates=3),
        TypeError,
        "aggregates",
    ),
    "step_summary aggregates the token rows": (
        lambda run: analysis.step_summary(run.tokens, aggregates=run.tokens),
        TypeError,
        "aggregates",
    ),
    "mismatch_per_step aggregates the samples": (
        lambda run: analysis.mismatch_per_step(run, aggregates=run.samples),
        TypeError,
        "aggregates",
    ),
    "step_summary the aggregates as token rows": (
        lambda run: analysis.step_summary(run.aggregates),
        TypeError,
        "tokens",
    ),
    "TokenQuery steps one int": (lambda run: TokenQuery(steps=5), TypeError, "TokenQuery.steps"),
    "TokenQuery steps three ints": (lambda run: TokenQuery(steps=(0, 1, 2)), TypeError, "TokenQuery.steps"),
    "TokenQuery steps floats": (lambda run: TokenQuery(steps=(0.0, 3.5)), TypeError, "TokenQuery.steps[0]"),
    "TokenQuery steps text": (lambda run: TokenQuery(steps=("0", "3")), TypeError, "TokenQuery.steps[0]"),
    "TokenQuery samples one int": (lambda run: TokenQuery(samples=3), TypeError, "TokenQuery.samples"),
    "TokenQuery samples text": (lambda run: TokenQuery(samples="12"), TypeError, "TokenQuery.samples"),
    "TokenQuery samples floats": (
        lambda run: TokenQuery(samples=[1, 2.5]),
        TypeError,
        "TokenQuery.samples[1]",
    ),
    "TokenQuery decisions one pair": (
        lambda run: TokenQuery(decisions=("ppo", True)),
        TypeError,
        "TokenQuery.decisions[0]",
    ),
    "TokenQuery decisions a mapping": (
        lambda run: TokenQuery(decisions={"ppo": True}),
        TypeError,
        "TokenQuery.decisions",
    ),
    "TokenQuery decisions blocked text": (
        lambda run: TokenQuery(decisions=[("ppo", "yes")]),
        TypeError,
        "TokenQuery.decisions[0] blocked",
    ),
    "TokenQuery anchor_prob one number": (
        lambda run: TokenQuery(anchor_prob=0.5),
        TypeError,
        "TokenQuery.anchor_prob",
    ),
    "TokenQuery anchor_prob NaN": (
        lambda run: TokenQuery(anchor_prob=(NAN, 0.5)),
        ValueError,
        "TokenQuery.anchor_prob[0]",
    ),
    "TokenQuery advantage_sign a number": (
        lambda run: TokenQuery(advantage_sign=1),
        TypeError,
        "TokenQuery.advantage_sign",
    ),
    "TokenQuery text a number": (lambda run: TokenQuery(text=3), TypeError, "TokenQuery.text"),
    "threshold_sweep scales 0": (lambda run: analysis.threshold_sweep(run, "ppo", scales=[0.0]), ValueError, "scales"),
    "threshold_sweep scales a number": (
        lambda run: analysis.threshold_sweep(run, "ppo", scales=2.0),
        TypeError,
        "scales",
    ),
    "threshold_sweep a rule number": (lambda run: analysis.threshold_sweep(run, 7), TypeError, "rules"),
    "threshold_sweep base unknown rule": (
        lambda run: analysis.threshold_sweep(run, "ppo", base={"ppoo": {"low": 0.2}}),
        ValueError,
        "ppoo",
    ),
    "threshold_sweep base a number": (
        lambda run: analysis.threshold_sweep(run, "ppo", base={"ppo": 0.2}),
        TypeError,
        "base",
    ),
    "with_rules a rule number": (lambda run: analysis.with_rules(run, [7]), TypeError, "rules"),
    "detect_collapse signals a LazyFrame": (
        lambda run: analysis.detect_collapse(run, signals=pl.LazyFrame()),
        TypeError,
        "signals",
    ),
    "detect_collapse signals without step": (
        lambda run: analysis.detect_collapse(run, signals=pl.DataFrame({"x": [1.0]})),
        ValueError,
        "signals",
    ),
    "mismatch_trend None": (lambda run: analysis.mismatch_trend(None, ["k3_kl"]), TypeError, "per_step"),
    "mismatch_trend no step": (
        lambda run: analysis.mismatch_trend(pl.DataFrame({"k3_kl": [1.0]}), ["k3_kl"]),
        ValueError,
        "step",
    ),
    "mismatch_trend window 1.5": (
        lambda run: analysis.mismatch_trend(pl.DataFrame({"step": [0], "k3_kl": [1.0]}), ["k3_kl"], window=1.5),
        TypeError,
        "window",
    ),
    "collapse_onset accuracy numbers": (
        lambda run: analysis.collapse_onset([0.5, 0.4], [(0, 1.0)]),
        TypeError,
        "accuracy",
    ),
    "collapse_onset accuracy None": (lambda run: analysis.collapse_onset(None, []), TypeError, "accuracy"),
    "collapse_onset reward a DataFrame": (
        lambda run: analysis.collapse_onset([], pl.DataFrame({"step": [0]})),
        TypeError,
        "reward",
    ),
    "collapse_onset accuracy NaN": (
        lambda run: analysis.collapse_onset([(0, NAN), (1, 0.1)], []),
        ValueError,
        "accuracy",
    ),
    "rule_boundaries typo": (lambda run: analysis.rule_boundaries(["ppoo"]), KeyError, "ppoo"),
    "rule_boundaries a string": (lambda run: analysis.rule_boundaries("ppo"), TypeError, "rules"),
    "rule_boundaries n 0": (lambda run: analysis.rule_boundaries(["ppo"], n=0), ValueError, "n"),
    "rule_boundaries min_p 0": (lambda run: analysis.rule_boundaries(["ppo"], min_p=0.0), ValueError, "min_p"),
    "rule_boundaries low text": (lambda run: analysis.rule_boundaries({"ppo": {"low": "0.2"}}), ValueError, "low"),
    "rule_boundaries low negative": (
        lambda run: analysis.rule_boundaries({"ppo": {"low": -0.2}}),
        ValueError,
        "low",
    ),
    "rule_boundaries unknown field": (lambda run: analysis.rule_boundaries({"ppo": {"lo": 0.2}}), ValueError, "lo"),
    "run_outcomes a path": (lambda run: analysis.run_outcomes("runs"), TypeError, "runs"),
    "run_outcomes one Run": (lambda run: analysis.run_outcomes(run), TypeError, "runs"),
    "run_outcomes a list of paths": (lambda run: analysis.run_outcomes(["runs/ppo"]), TypeError, "runs[0]"),
    "seed_table None": (lambda run: analysis.seed_table(None), TypeError, "outcomes"),
    "seed_table by typo": (
        lambda run: analysis.seed_table(pl.DataFrame({"run": ["a"], "rule": ["ppo"], "seed": [0]}), by="rul"),
        ValueError,
        "rul",
    ),
}


@pytest.mark.parametrize("label", list(DOMAIN_CASES))
def test_analysis_arguments_are_checked_at_the_entry(run, label):
    call, error, word = DOMAIN_CASES[label]
    with pytest.raises(error) as caught:
        call(run)
    assert re.search(rf"(^|\W){re.escape(word)}(?!\w)", str(caught.value)), str(caught.value)


def test_valid_analysis_arguments_at_their_edges(run):
    same = analysis.rule_confusion(run, "ppo", "ppo", per_step=False).row(0, named=True)
    assert (same["only_a"], same["only_b"], same["agreement"]) == (0, 0, 1.0)  # a rule agrees with itself
    assert analysis.collapse_onset([], []) == (None, None)
    assert analysis.collapse_onset([(0, 0.8), (5, 0.3)], [(0, 1.0)]) == (5, "accuracy")
    assert analysis.blocked_by_token(run, "ppo", top=1, min_count=1).height <= 1
    assert analysis.step_summary(run, columns=["tokens"]).columns == ["step", "tokens"]
    assert analysis.threshold_sweep(run, "ppo", scales=(1.0,), base={"ppo": {"low": 0.2, "high": 0.2}}).height == 1
    assert analysis.bucket_table(min_p=1e-2, per_decade=2).height == 4
    assert analysis.rule_boundaries({"ppo": {"low": 0.1, "high": 0.1, "description": "x"}}, n=2).height == 2
