"""`trustlens report`: one self-contained HTML file — its numbers are the analyses', hostile run
text stays text, and Chromium draws every figure with the network cut off."""

import re
from pathlib import Path

import polars as pl
import pytest
from test_dashboard_browser import ARGS, CHROMIUM, PROMPTS, RUN_NAME, _hostile_run

from trustlens import load_run, plots
from trustlens.analysis import detect_collapse, rule_confusion
from trustlens.analysis.agreement import default_rule_pair
from trustlens.report import build_report, write_report

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample_run"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    return _hostile_run(tmp_path_factory.mktemp("report_runs"))


@pytest.fixture(scope="module")
def report(hostile, tmp_path_factory) -> Path:
    return write_report([SAMPLE / "ppo", hostile], tmp_path_factory.mktemp("report") / "report.html")


def test_one_file_with_plotly_inlined_once_and_no_outside_resource(report):
    text = report.read_text(encoding="utf-8")
    assert text.count("Plotly.newPlot") >= 10
    assert len(re.findall(r"<script>/\*\*\s*\n?\s*\* plotly\.js", text)) <= 1
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=[\"']?(https?:)?//", text), "an outside resource"
    for section in (
        "Overview",
        "PPO vs DPPO on the same tokens",
        "Training–inference mismatch",
        "Collapse alerts and their driving tokens",
        "A colour-coded token sample",
    ):
        assert text.count(section) >= 2  # one per run (and the run's contents line)


def test_numbers_are_the_analyses(report):
    text = report.read_text(encoding="utf-8")
    run = load_run(SAMPLE / "ppo")
    rules = [c.removeprefix("blocked_") for c in run.tokens.collect_schema().names() if c.startswith("blocked_")]
    a, b = default_rule_pair(rules)
    total = rule_confusion(run.tokens, a, b, per_step=False, aggregates=run.aggregates).row(0, named=True)
    # every A ≠ 0 token both decided: the sampled run's aggregates, not the kept rows' Σ weight
    decided = sum(run.aggregates.select(pl.sum("tokens_pos", "tokens_neg")).collect().row(0))
    assert total["count"] == decided
    assert f"on the {total['count']:,} A ≠ 0 tokens both decided: blocked by both {total['both']:,}" in text
    # the sample is recorded with sampling: the run's block rate is the aggregates' (all tokens)
    counts = run.aggregates.select(pl.sum("k_ppo_pos", "k_ppo_neg", "tokens_pos", "tokens_neg")).collect().row(0)
    ppo = (counts[0] + counts[1]) / (counts[2] + counts[3])
    assert f"<td>ppo</td><td>{plots.percent(ppo)}</td>" in text  # the dashboard's format: 4.29 %


def test_hostile_text_is_escaped(report, hostile):
    text = report.read_text(encoding="utf-8")
    assert "<img src=x" not in text and "<svg onload" not in text and "<script>alert" not in text
    assert "&lt;img src=x onerror=window.__tl_pwned=2&gt; run" in text  # the run name, as text
    alerts = detect_collapse(load_run(hostile))
    assert alerts.height and "Driving tokens" in text


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.is_file(), reason="Debian chromium not installed at /usr/bin/chromium")
def test_chromium_draws_every_figure_offline(report):
    playwright = pytest.importorskip("playwright.sync_api")
    requests, errors, dialogs = [], [], []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            page.route(
                "**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort()
            )
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(report.as_uri())
            page.wait_for_load_state("load")
            page.wait_for_timeout(1500)
            figures = page.locator(".plotly-graph-div").count()
            drawn = page.locator(".plotly-graph-div .main-svg").count()
            assert figures >= 10 and page.evaluate(
                "() => [...document.querySelectorAll('.plotly-graph-div')].every(d => d.querySelector('.main-svg'))"
            ), f"{figures} figures, {drawn} svg layers"
            assert page.evaluate("() => window.__tl_pwned === undefined")
            assert page.locator("img[src=x]").count() == 0
            body = page.inner_text("body")
            assert RUN_NAME in body and any(prompt in body for prompt in PROMPTS)
        finally:
            browser.close()
    assert [u for u in requests if not u.startswith("file:")] == []
    assert errors == [] and dialogs == []


def test_cli_and_bad_input(tmp_path, capsys):
    # in-process: trustlens.cli.main is what `trustlens report` runs (a process of its own only adds its start-up)
    from trustlens.cli import main

    assert main(["report", str(SAMPLE / "pg_is"), "-o", str(tmp_path / "r.html")]) == 0
    assert "report written to" in capsys.readouterr().out and (tmp_path / "r.html").stat().st_size > 1_000_000
    with pytest.raises(ValueError, match="at least one run"):
        build_report([])
    with pytest.raises(ValueError, match="is a folder"):
        write_report([SAMPLE / "pg_is"], tmp_path)
    assert main(["report", str(tmp_path / "absent")]) != 0
    assert "absent" in capsys.readouterr().err
