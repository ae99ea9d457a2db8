"""The Overview page's Doctor panel (app/views/doctor_panel.py) through Streamlit's AppTest: a
planted defect's finding with its fix, example tokens that open the token inspector on their
response, and a clean run's all-ok line."""

from pathlib import Path

import pytest
from benchmark_scripts import load
from streamlit.testing.v1 import AppTest

from trustlens import dashboard
from trustlens.analysis.diagnosis import CHECKS

bench = load("doctor_detection")
ENTRY = Path(__file__).resolve().parent.parent / "app" / dashboard.ENTRY


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("doctor_runs")
    bench.write_planted(root / "a_sentinel", "sentinel", 0)
    bench.write_planted(root / "b_clean", "clean", 0)
    return root


def _overview(monkeypatch, root: Path, run: str) -> AppTest:
    monkeypatch.setenv(dashboard.RUNS_ENV, str(root))
    at = AppTest.from_file(str(ENTRY), default_timeout=120).run()
    at.sidebar.selectbox(key="tl_run").set_value(run).run()
    at.switch_page("views/overview.py").run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def test_panel_shows_the_planted_defect_and_links_its_tokens(monkeypatch, runs):
    at = _overview(monkeypatch, runs, "a_sentinel")
    assert "Doctor" in [s.value for s in at.subheader]
    text = "\n".join(m.value for m in at.markdown)
    assert "**problem** · sentinel" in text
    assert any(c.value.startswith("Likely fix: mask the positions") for c in at.caption)
    at.button(key="doctor_0_0").click().run()
    assert not at.exception
    assert next(t.value for t in at.title) == "Token inspector"
    assert any("Showing the tokens behind doctor sentinel" in i.value for i in at.info)


def test_panel_on_a_clean_run(monkeypatch, runs):
    at = _overview(monkeypatch, runs, "b_clean")
    assert any(s.value == f"All {len(CHECKS)} checks ok." for s in at.success)
