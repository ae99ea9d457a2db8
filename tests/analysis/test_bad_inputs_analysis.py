"""Bad inputs to the analyses: CollapseConfig's fields, a rule the run did not record, and the
wrong kind of object where a Run or its token rows are expected (issue 32). Each case asserts
the error type and that the message names the argument."""

from __future__ import annotations

import math

import polars as pl
import pytest

from trustlens import analysis
from trustlens.analysis.collapse import CollapseConfig, detect_collapse
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
