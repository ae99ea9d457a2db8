"""The Mismatch page's table by staleness, shown where the run recorded the engine's weight
versions (the per-token `staleness` column) and absent otherwise."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from trustlens import dashboard
from trustlens.run.tables import write_run

ENTRY = Path(__file__).resolve().parent.parent / "app" / dashboard.ENTRY


def _tokens(n: int, staleness: bool) -> dict:
    old = [-0.7] * n
    mu = [-0.7] * (n // 2) + [-1.2] * (n - n // 2)
    tokens = {"step": [0] * n, "sample": list(range(n)), "pos": [1] * n, "token_id": [0] * n}
    tokens |= {"mu_logp": mu, "old_logp": old, "pi_logp": old}
    return tokens | ({"staleness": [0.0] * (n // 2) + [2.0] * (n - n // 2)} if staleness else {})


@pytest.mark.parametrize("staleness", [True, False])
def test_mismatch_page_shows_the_mismatch_by_staleness(monkeypatch, tmp_path, staleness):
    write_run(tmp_path / "run", tokens=_tokens(40, staleness), rules=[])
    monkeypatch.setenv(dashboard.RUNS_ENV, str(tmp_path))
    at = AppTest.from_file(str(ENTRY), default_timeout=120).run()
    at.switch_page("views/mismatch.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert ("By staleness" in [h.value for h in at.subheader]) == staleness
    if staleness:
        table = at.dataframe[0].value
        assert list(table["staleness"]) == [0.0, 2.0] and list(table["tokens"]) == [20, 20]
