"""The real thing: `trustlens dashboard` served on localhost, every page opened in headless
Debian Chromium (driven by Playwright), no error box, hostile run text shown and never run.

Screenshots go to artifacts/browser/ at the repository root (git-ignored).
"""

import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trustlens import dashboard
from trustlens.synthetic import HOSTILE_VOCAB, VOCAB, write_part, write_synthetic_run

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "artifacts" / "browser"
# url path → the page title; the default page is served at "/"
PAGES = {
    "": "Overview",
    "token_inspector": "Token inspector",
    "ppo_vs_dppo": "PPO vs DPPO",
    "mismatch": "Mismatch",
    "collapse": "Collapse signals",
    "compare": "Compare runs",
}
# Sets a flag if any injected markup ever runs; alert() is caught by the dialog handler.
FLAG_PROMPT = '<img src=x onerror="window.__tl_pwned=1">'
# The run's folder name is shown on every page (run picker, captions, legends): hostile too.
RUN_NAME = "<img src=x onerror=window.__tl_pwned=2> run"
PROMPTS = (
    "<script>alert(1)</script>",
    FLAG_PROMPT,
    "[click](javascript:alert(3))",
    "<svg onload=alert(4)>",
    "**bold** $x$",
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.is_file(),
        reason="Debian chromium not installed at /usr/bin/chromium "
        "(apt-get install chromium chromium-driver; .ci/run does)",
    ),
]
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hostile_run(root: Path) -> Path:
    run = write_synthetic_run(
        root / RUN_NAME,
        steps=10,
        samples_per_step=16,
        seq_len=24,
        seed=5,
        collapse_at=6,
        vocab=HOSTILE_VOCAB + VOCAB[: 80 - len(HOSTILE_VOCAB)],
    )
    for part in sorted((run / "samples").glob("rank=*/part-*.parquet")):
        table = pq.read_table(part)
        prompts = pa.array([PROMPTS[i % len(PROMPTS)] for i in range(table.num_rows)], pa.string())
        table = table.set_column(table.schema.get_field_index("prompt"), "prompt", prompts)
        index = int(part.stem.split("-")[1])
        part.unlink()
        write_part(table, part.parent, index)
    return run


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`trustlens dashboard RUNS --port P` serving a hostile run in the background; yields its URL.
    Terminating the command stops the Streamlit server it started."""
    runs = tmp_path_factory.mktemp("browser_runs")
    _hostile_run(runs)
    port = _free_port()
    log = open(tmp_path_factory.mktemp("log") / "dashboard.log", "w+")
    exe = Path(sys.executable).parent / "trustlens"
    cli = [str(exe)] if exe.is_file() else [sys.executable, "-m", "trustlens.cli"]
    proc = subprocess.Popen([*cli, "dashboard", str(runs), "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            dashboard.wait_until_ready(proc, url)
        except RuntimeError as err:
            log.seek(0)
            pytest.fail(f"{err}:\n{log.read()}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _settle(page, title: str) -> None:
    """Wait until the page shows `title` and Streamlit has finished running the script."""
    page.get_by_role("heading", name=title).first.wait_for(timeout=60_000)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=60_000)
    page.wait_for_timeout(500)  # let plotly draw


def _hostile_text_is_text(page) -> None:
    """The hostile tokens and prompt are on screen as literal text, and every token's hover text
    holds its values."""
    body = page.inner_text("body")
    assert "<script>alert(1)</script>" in body or "<img src=x onerror=alert(1)>" in body
    assert any(prompt in body for prompt in PROMPTS)
    assert RUN_NAME in body
    assert page.locator("img[src=x]").count() == 0 and page.locator("svg[onload]").count() == 0
    title = page.locator("span[title]").first.get_attribute("title")
    assert "ratio = " in title and "blocked by:" in title


def test_every_page_in_chromium(server):
    SHOTS.mkdir(parents=True, exist_ok=True)
    dialogs: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            for path, title in PAGES.items():
                page.goto(f"{server}/{path}")
                _settle(page, title)
                page.screenshot(path=str(SHOTS / f"{path or 'overview'}.png"))
                assert page.locator('[data-testid="stException"]').count() == 0, f"exception on {title}"
                assert page.locator('[data-testid="stAlertContentError"]').count() == 0, f"error on {title}"
                assert page.evaluate("() => window.__tl_pwned === undefined"), f"injected markup ran on {title}"
                if path == "token_inspector":
                    _hostile_text_is_text(page)

            # click-through: an alert's button opens the inspector on the tokens behind it
            page.goto(f"{server}/collapse")
            _settle(page, "Collapse signals")
            page.get_by_role("button", name="Inspect tokens").first.click()
            _settle(page, "Token inspector")
            assert "Showing the tokens behind alert" in page.inner_text("body")
            page.screenshot(path=str(SHOTS / "alert_click_through.png"))
            assert page.locator('[data-testid="stException"]').count() == 0
        finally:
            browser.close()
    assert dialogs == [], f"a dialog opened: injected script ran ({dialogs})"
