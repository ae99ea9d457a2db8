"""The metric registry: one name per metric, templates resolve, no torch or polars import."""

import subprocess
import sys

import pytest

from trustlens.metrics import METRICS, MISMATCH_METRICS, blocked_rate, describe, metric


def test_names_are_unique_and_documented():
    assert len(METRICS) == len({m.name for m in METRICS.values()})
    for m in METRICS.values():
        assert m.doc and m.unit


def test_mismatch_names_follow_verl_where_verl_has_one():
    assert metric("mismatch_kl").verl == "rollout_corr/kl"
    assert metric("k3_kl").verl == "rollout_corr/k3_kl"
    assert metric("prob_diff_mean").verl == "training/rollout_probs_diff_mean"
    # the old clash: top-K TV and |π_old − μ| have different names now
    assert "tv_mean" not in METRICS and metric("topk_tv_mean") != metric("prob_diff_mean")
    assert set(MISMATCH_METRICS) <= set(METRICS)


def test_blocked_rate_template():
    assert blocked_rate("ppo", "pos") == "blocked/ppo/pos"
    assert metric("blocked/dppo_binary_tv/neg").name == "blocked/<rule>/<sign>"
    assert metric("blocked/active").name == "blocked/active"
    assert "ppo" in describe("blocked/ppo/neg") or "rule" in describe("blocked/ppo/neg")
    with pytest.raises(ValueError, match="sign"):
        blocked_rate("ppo", "zero")
    with pytest.raises(KeyError, match="not in the registry"):
        metric("tv_mean")


def test_imports_neither_torch_nor_polars():
    code = "import sys, trustlens.metrics; print(sorted({'torch', 'polars'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_docs_list_every_metric():
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
    for m in METRICS.values():
        assert f"| `{m.name}` | {m.unit} |" in doc, m.name
        assert m.verl is None or f"`{m.verl}`" in doc
