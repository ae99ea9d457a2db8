"""Headline tiles that fit: every page of the shipped collapse (pg_is) and of a learning run like
the demo's, opened in headless Chromium at 1,280 and 1,920 px, has no tile whose label or value
is cut off (wider than its box, or ending in an ellipsis). Screenshots of every page at both
widths go to artifacts/browser/tiles/ (git-ignored)."""

import shutil

import pytest
from test_dashboard_browser import ARGS, CHROMIUM, PAGES, ROOT, _no_error, _served, _settle, playwright

SHOTS = ROOT / "artifacts" / "browser" / "tiles"
SAMPLE = ROOT / "data" / "sample_run"
RUNS = ("pg_is", "learning")  # the shipped collapse, and the default preset's run the demo trains
WIDTHS = (1280, 1920)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.is_file(), reason="Debian chromium not installed at /usr/bin/chromium"),
]

# Every element inside a tile (label, value, change) whose text is wider than its box while
# clipped, or cut with an ellipsis: the tile's text, what was cut and the two widths.
CUT_TILES = """() => {
  const cut = [];
  for (const tile of document.querySelectorAll('[data-testid="stMetric"]')) {
    for (const el of tile.querySelectorAll('*')) {
      const style = getComputedStyle(el);
      const clipped = style.overflow !== 'visible' || style.textOverflow === 'ellipsis';
      if (clipped && el.scrollWidth > el.clientWidth + 1) {
        cut.push(`${tile.innerText.replace(/\\n+/g, ' | ')} (${el.scrollWidth} > ${el.clientWidth} px)`);
        break;
      }
    }
  }
  return cut;
}"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    runs = tmp_path_factory.mktemp("tile_runs")
    for name in RUNS:
        shutil.copytree(SAMPLE / name, runs / name)
    with _served(runs, tmp_path_factory.mktemp("tile_log")) as url:
        yield url


def test_no_tile_is_cut_off(server):
    SHOTS.mkdir(parents=True, exist_ok=True)
    cut: dict[str, list[str]] = {}
    tiles_seen = 0
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            for width in WIDTHS:
                page = browser.new_page(viewport={"width": width, "height": 1200})
                for run in RUNS:
                    for path, title in PAGES.items():
                        page.goto(f"{server}/{path}?run={run}")
                        _settle(page, title)
                        _no_error(page, f"{title} of {run} at {width} px")
                        page.screenshot(path=str(SHOTS / f"{run}_{path or 'overview'}_{width}.png"), full_page=True)
                        tiles_seen += page.locator('[data-testid="stMetric"]').count()
                        found = page.evaluate(CUT_TILES)
                        if found:
                            cut[f"{run} {title} at {width} px"] = found
                page.close()
        finally:
            browser.close()
    assert tiles_seen > 0
    assert cut == {}
