"""The dashboard on an imported run (metrics only, `trustlens import`): the Collapse and Compare
pages work from its logged metrics; every page that needs tokens says once that it has none."""

from pathlib import Path

import pytest
from ingest.logs import verl_steps, write_verl_tensorboard
from streamlit.testing.v1 import AppTest

from trustlens import dashboard
from trustlens.analysis.collapse.logged import NO_TOKENS
from trustlens.ingest import import_log
from trustlens.synthetic import write_synthetic_run

APP = Path(__file__).resolve().parent.parent / "app"
TOKEN_PAGES = ("views/overview.py", "views/token_inspector.py", "views/ppo_vs_dppo.py", "views/mismatch.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("imported_runs")
    import_log(write_verl_tensorboard(root.parent / "verl_tb", verl_steps(120, filler=False)), root / "a_verl")
    write_synthetic_run(root / "b_recorded", steps=8, samples_per_step=16, seq_len=16, seed=0)
    return root


def _at(monkeypatch, runs: Path, page: str) -> AppTest:
    monkeypatch.setenv(dashboard.RUNS_ENV, str(runs))
    at = AppTest.from_file(str(APP / dashboard.ENTRY), default_timeout=120).run()
    at.sidebar.selectbox(key="tl_run").set_value("a_verl").run()
    at.switch_page(page).run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def _text(at: AppTest) -> str:
    return "\n".join(str(e.value) for kind in ("markdown", "caption", "info", "warning") for e in getattr(at, kind))


def test_collapse_page_shows_the_imported_run_s_alerts(monkeypatch, runs):
    at = _at(monkeypatch, runs, "views/collapse.py")
    text = _text(at)
    assert text.count(NO_TOKENS) == 1
    assert "reward" in text and "accuracy" in text  # the critical alerts' timeline
    assert len(at.get("plotly_chart")) >= 1 and not at.error


@pytest.mark.parametrize("page", TOKEN_PAGES)
def test_pages_that_need_tokens_say_so_once(monkeypatch, runs, page):
    at = _at(monkeypatch, runs, page)
    assert _text(at).count(NO_TOKENS) == 1 and not at.error


def test_compare_page_overlays_imported_and_recorded_runs(monkeypatch, runs):
    at = _at(monkeypatch, runs, "views/compare.py")
    assert _text(at).count(NO_TOKENS) == 1 and not at.error
    assert len(at.get("plotly_chart")) >= 1
