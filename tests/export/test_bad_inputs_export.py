"""Bad inputs to the exports and the report (issue 32): a path, None, a DataFrame or the token
rows where a Run is expected, and empty destinations. Each case asserts the error type and that
the message names the argument."""

from __future__ import annotations

import polars as pl
import pytest

from trustlens import export, report
from trustlens.run import load_run
from trustlens.synthetic import write_synthetic_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = write_synthetic_run(tmp_path_factory.mktemp("x") / "r", steps=2, samples_per_step=8, seq_len=4, group_size=4)
    return load_run(path)


WRONG = {"None": None, "a number": 3, "a DataFrame": pl.DataFrame()}


@pytest.mark.parametrize("given", list(WRONG))
def test_a_run_is_required(given):
    with pytest.raises(TypeError, match="step_scalars: run must be"):
        export.step_scalars(WRONG[given])
    with pytest.raises(TypeError, match="driving_tokens: run must be"):
        export.driving_tokens(WRONG[given], pl.DataFrame())
    with pytest.raises(TypeError, match=r"^runs must be"):
        report.build_report(WRONG[given])
    with pytest.raises(TypeError, match=r"^tokens must be"):
        export.token_scalars(WRONG[given] if given != "a DataFrame" else [1])
    with pytest.raises(TypeError, match=r"^alerts must be"):
        export.alert_text(WRONG[given] if given != "a DataFrame" else [1])


def test_the_token_rows_are_not_a_run(run):
    with pytest.raises(TypeError, match="step_scalars: run must be"):
        export.step_scalars(run.tokens)
    with pytest.raises(TypeError, match=r"runs\[0\]"):
        report.build_report([run.tokens])


@pytest.mark.parametrize("out", ["", None])
def test_destinations_are_named(run, out, tmp_path):
    error = ValueError if out == "" else TypeError
    with pytest.raises(error, match=r"^out"):
        report.write_report([run], out)
    with pytest.raises(error, match=r"^logdir"):
        export.export_tensorboard([run], out)
    with pytest.raises(TypeError, match=r"^title"):
        report.build_report([run], title=None)


def test_valid_exports(run, tmp_path):
    assert export.step_scalars(run)["step"].n_unique() == 2
    assert export.alert_text(pl.DataFrame()) == {}
    assert report.write_report([run], tmp_path / "new" / "r.html").is_file()  # its folder is made


@pytest.mark.parametrize(
    ("call", "error", "named"),
    [
        (lambda: export.StepMirror("tensorboard"), TypeError, "sink"),
        (lambda: export.StepMirror(None), TypeError, "sink"),
        (lambda: export.make_mirror("tensorbord:tb"), ValueError, r"mirror must be .*did you mean 'tensorboard'"),
        (lambda: export.make_mirror("tensorboard:"), ValueError, "mirror must be"),
        (lambda: export.make_mirror(3), ValueError, "mirror"),
    ],
)
def test_mirrors_name_the_argument(call, error, named):
    with pytest.raises(error, match=named):
        call()
