"""trustlens.notebook: the figure renderer of the notebooks and the runs they default to."""

import plotly.io as pio
import pytest

from trustlens import notebook
from trustlens.synthetic import write_synthetic_run


@pytest.fixture
def restore_renderer():
    before = pio.renderers.default
    yield
    pio.renderers.default = before


def test_interactive_figures_are_plotly_json_only(restore_renderer):
    assert notebook.setup_figures("interactive") == "plotly_mimetype"
    assert pio.renderers.default == "plotly_mimetype"


def test_mode_from_the_environment(restore_renderer, monkeypatch):
    monkeypatch.setenv(notebook.FIGURES_ENV, "interactive")
    assert notebook.setup_figures() == "plotly_mimetype"
    monkeypatch.setenv(notebook.FIGURES_ENV, "fancy")
    with pytest.raises(ValueError, match="fancy"):
        notebook.setup_figures()


def test_static_figures_fall_back_when_nothing_can_draw(restore_renderer, monkeypatch, capsys):
    monkeypatch.setattr(notebook, "_static_works", lambda: "no browser here")
    assert notebook.setup_figures("static") == "plotly_mimetype"
    assert "no browser here" in capsys.readouterr().out


def test_sample_runs_of_a_folder(tmp_path):
    for rule in ("ppo", "pg_is"):
        write_synthetic_run(
            tmp_path / rule, steps=2, samples_per_step=8, seq_len=8, rules=[rule, "dppo_binary_tv"], active_rule=rule
        )
    runs = notebook.sample_runs(tmp_path)
    assert list(runs) == ["pg_is", "ppo"]
    assert runs["ppo"].active_rule == "ppo"


def test_sample_runs_fall_back_to_synthetic_runs(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TRUSTLENS_DATA", str(tmp_path / "nothing"))
    runs = notebook.sample_runs()
    assert sorted(runs) == sorted(notebook.FALLBACK_RULES)
    assert "synthetic" in capsys.readouterr().out
    assert runs["pg_is"].manifest["config"]["collapse_at"] == notebook.FALLBACK_COLLAPSE_AT
