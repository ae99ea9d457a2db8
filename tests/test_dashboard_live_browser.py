"""The dashboard in Chromium on a run that a background process writes during the test: the live
line's step grows without a reload, the sidebar's filter stays, a new alert shows as a toast, and
once the run has finished the live line is gone. Slow (about a minute): run it with -m slow."""

import subprocess
import sys
import time

import pytest
from test_dashboard_browser import CHROMIUM, _browser, _no_error, _served, _settle, playwright

from trustlens.run import MANIFEST

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,  # about a minute (the run takes ~40 s to write); tests/test_dashboard_live.py is fast
    pytest.mark.skipif(not CHROMIUM.is_file(), reason="Debian chromium not installed at /usr/bin/chromium"),
]

# A synthetic run written one step every STEP_SECONDS, collapsing at step 14 (alerts from ~15 on).
STEPS, STEP_SECONDS = 26, 1.5
WRITER = """
import sys, time
from trustlens.synthetic import write_synthetic_run
write_synthetic_run(sys.argv[1], steps={steps}, samples_per_step=16, seq_len=16, collapse_at=14, seed=1,
                    rows_per_part=1, on_step=lambda step: time.sleep({pause}))
"""


# the text of the live line, when the page shows one
LIVE_LINE = """() => [...document.querySelectorAll('[data-testid="stMarkdownContainer"]')]
    .map(e => e.innerText).find(t => /live/.test(t) && /updated/.test(t)) || null"""


# records the text of every toast shown (a toast goes away after a few seconds)
TOAST_RECORDER = """() => {
    window.__tl_toasts = [];
    new MutationObserver(() => document.querySelectorAll('[data-testid="stToast"]').forEach(t => {
        if (!t.__seen) { t.__seen = true; window.__tl_toasts.push(t.innerText); }
    })).observe(document.body, {childList: true, subtree: true});
}"""


def _live_step(page) -> int | None:
    """The step the live line shows, None when there is no live line."""
    line = page.evaluate(LIVE_LINE)
    words = (line or "").split()
    return int(words[words.index("step") + 1]) if "step" in words else None


def test_a_run_written_during_the_test_is_followed_live(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    run = runs / "growing"
    writer = None
    with _served(runs, tmp_path) as url, playwright.sync_playwright() as p:
        try:
            writer = subprocess.Popen(
                [sys.executable, "-c", WRITER.format(steps=STEPS, pause=STEP_SECONDS), str(run)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            deadline = time.monotonic() + 60
            while not (run / "tokens" / "rank=0" / "part-000002.parquet").exists():
                assert writer.poll() is None and time.monotonic() < deadline, "the writer did not start"
                time.sleep(0.2)
            browser = _browser(p)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1400})
                page.goto(f"{url}/?run=growing")
                _settle(page, "Overview")
                page.evaluate(TOAST_RECORDER)
                first = _live_step(page)
                assert first is not None and first < STEPS - 1
                sign = page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').filter(
                    has_text="Advantage"
                )
                sign.locator("button, input").first.click()
                page.get_by_role("option", name="pos", exact=True).click()
                _settle(page, "Overview")

                deadline = time.monotonic() + 90  # the page reruns by itself into later steps
                while (_live_step(page) or 0) <= first:
                    assert time.monotonic() < deadline, f"the live line stayed at step {first}"
                    page.wait_for_timeout(500)
                assert sign.locator("input").input_value() == "pos"  # the filter stayed
                page.wait_for_function("() => window.__tl_toasts.length > 0", timeout=120_000)
                assert "alert" in page.evaluate("() => window.__tl_toasts[0]")

                assert writer.wait(timeout=120) == 0
                page.wait_for_function(f"() => !({LIVE_LINE})()", timeout=60_000)  # finished: no live line
                _settle(page, "Overview")
                _no_error(page, "a live run")
                assert '"finished"' in (run / MANIFEST).read_text()
            finally:
                browser.close()
        finally:
            if writer is not None:
                if writer.poll() is None:
                    writer.kill()
                writer.wait()
