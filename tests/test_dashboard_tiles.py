"""Readable at a glance, in headless Chromium at 1,280 and 1,920 px: every page of the shipped
collapse (pg_is) and of the demo's run, and the view `trustlens demo` opens (Compare runs with
the demo beside pg_is and dppo_binary_tv), laid out as the demo lays them out. On each:

- no tile whose label or value is cut off (wider than its box, or ending in an ellipsis);
- no misplaced legend: each plotly legend lies nearer its own panels (those of the traces it
  lists) than any other panel of its figure, within LEGEND_REACH px of them, and overlaps no
  other legend;
- no button whose label is cut or wider than its column (the alerts' "Inspect tokens" included);
- no figure or panel title running past its figure's edge.

The demo's run is the shipped `learning` run standing in: `trustlens demo` trains the same preset
with another seed, which takes minutes on 2 cores. Full-page screenshots of every view go to
artifacts/browser/pages/ (git-ignored).
"""

import shutil

import pytest
from test_dashboard_browser import ARGS, CHROMIUM, PAGES, ROOT, _no_error, _served, _settle, playwright

from trustlens.train.sample import DEMO_BESIDE, demo_view

SHOTS = ROOT / "artifacts" / "browser" / "pages"
SAMPLE = ROOT / "data" / "sample_run"
DEMO = "demo"  # the demo's run folder: the shipped learning run stands in
RUNS = (DEMO, "sample_run/pg_is")
WIDTHS = (1280, 1920)
# farthest a legend may lie from its own panels, px (a legend under two panels clears their
# tick labels and axis title)
LEGEND_REACH = 120
# tallest full-page screenshot, px
MAX_SHOT_HEIGHT = 6000
# ms for the page to lay itself out again after the window is resized (plotly redraws its figures)
RELAYOUT_MS = 1000

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

# Every drawn legend of every plotly figure whose box is not beside its own panels: its panels
# are the subplots of the traces it lists (a trace hidden from the legend counts with the
# visible one of its legend group). Misplaced: listing no panel, farther than `reach` px from
# its panels, nearer another panel of the figure (by distance, then by vertical overlap), or
# overlapping another legend. Also returns how many legends were checked.
MISPLACED_LEGENDS = """(reach) => {
  const bad = [];
  let checked = 0;
  const gap = (a, b) => Math.hypot(
    Math.max(0, b.left - a.right, a.left - b.right), Math.max(0, b.top - a.bottom, a.top - b.bottom));
  const overlap = (a, b) => Math.max(0, Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top));
  const near = (box, panels) => panels.map((p) => [gap(box, p), -overlap(box, p)])
    .reduce((m, k) => (k[0] < m[0] || (k[0] === m[0] && k[1] < m[1]) ? k : m), [Infinity, 0]);
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const full = gd._fullLayout;
    if (!full || !full._plots) continue;
    const name = (full.title && full.title.text) || '(untitled figure)';
    const g = gd.getBoundingClientRect();
    const panels = {};
    for (const [id, p] of Object.entries(full._plots)) {
      panels[id] = {left: g.left + p.xaxis._offset, right: g.left + p.xaxis._offset + p.xaxis._length,
                    top: g.top + p.yaxis._offset, bottom: g.top + p.yaxis._offset + p.yaxis._length};
    }
    const groups = {}, own = {};
    const traces = gd._fullData.filter((t) => t.visible !== false);
    for (const t of traces.filter((t) => t.showlegend)) {
      const id = t.legend || 'legend';
      (groups[id] = groups[id] || new Set()).add(t.legendgroup || `#${t.index}`);
    }
    for (const t of traces) {
      const id = t.legend || 'legend';
      if (groups[id] && groups[id].has(t.legendgroup || `#${t.index}`)) {
        (own[id] = own[id] || new Set()).add((t.xaxis || 'x') + (t.yaxis || 'y'));
      }
    }
    const boxes = [];
    for (const el of gd.querySelectorAll('g.infolayer > g[class^="legend"]')) {
      const id = [...el.classList].find((c) => /^legend\\d*$/.test(c));
      const box = el.getBoundingClientRect();
      if (!id || box.width === 0 || box.height === 0) continue;
      checked += 1;
      const mine = [...(own[id] || [])].map((s) => panels[s]).filter(Boolean);
      const others = Object.entries(panels).filter(([s]) => !(own[id] || new Set()).has(s)).map(([, p]) => p);
      const where = `${name}: ${id} at (${Math.round(box.left - g.left)}, ${Math.round(box.top - g.top)})`;
      if (!mine.length) { bad.push(`${where} lists no panel`); continue; }
      const k = near(box, mine), o = near(box, others);
      if (k[0] > reach) bad.push(`${where} is ${Math.round(k[0])} px from its panels`);
      else if (others.length && (o[0] < k[0] || (o[0] === k[0] && o[1] < k[1])))
        bad.push(`${where} is nearer another panel than its own`);
      for (const b of boxes) {
        if (gap(box, b) === 0 && overlap(box, b) > 0 && box.left < b.right && b.left < box.right)
          bad.push(`${where} overlaps another legend`);
      }
      boxes.push(box);
    }
  }
  return [bad, checked];
}"""

# Every figure title and subplot title of a plotly figure that runs past the figure's edge (the
# SVG clips it): its text.
CUT_TITLES = """() => {
  const cut = [];
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const g = gd.getBoundingClientRect();
    for (const t of gd.querySelectorAll('text.gtitle, g.annotation text')) {
      const box = t.getBoundingClientRect();
      if (box.width && (box.left < g.left - 1 || box.right > g.right + 1)) cut.push(`title cut: ${t.textContent}`);
    }
  }
  return cut;
}"""

# Every visible button whose label is cut (clipped or ellipsised) or that is wider than its
# column: the label and the widths.
CUT_BUTTONS = """() => {
  const cut = [];
  for (const b of document.querySelectorAll('button')) {
    const text = b.innerText.trim();
    if (!text || b.offsetParent === null) continue;
    const column = b.closest('[data-testid="stColumn"]');
    const box = b.getBoundingClientRect();
    let clipped = column !== null && box.right > column.getBoundingClientRect().right + 1;
    for (const el of [b, ...b.querySelectorAll('*')]) {
      const style = getComputedStyle(el);
      const hides = style.overflow !== 'visible' || style.textOverflow === 'ellipsis';
      if (hides && el.scrollWidth > el.clientWidth + 1) clipped = true;
    }
    if (clipped) cut.push(`${text.replace(/\\n+/g, ' ')} (${Math.round(box.width)} px)`);
  }
  return cut;
}"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The dashboard on the demo's layout: its run (here the shipped learning run) beside a copy
    of the shipped sample in sample_run/."""
    runs = tmp_path_factory.mktemp("demo_layout")
    shutil.copytree(SAMPLE / "learning", runs / DEMO)
    for name in DEMO_BESIDE:
        shutil.copytree(SAMPLE / name, runs / "sample_run" / name)
    with _served(runs, tmp_path_factory.mktemp("pages_log")) as url:
        yield url


def _full_page_shot(page, width: int, path) -> None:
    """A screenshot of the whole page: the viewport grown to the main column's height (the app
    scrolls inside it, so Playwright's full_page sees one screen), then set back."""
    height = page.evaluate(
        "() => Math.max(...[...document.querySelectorAll('[data-testid=\"stMain\"], section')]"
        ".map((e) => e.scrollHeight), 800)"
    )
    page.set_viewport_size({"width": width, "height": min(height, MAX_SHOT_HEIGHT)})
    page.wait_for_timeout(400)
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": width, "height": 1200})


def test_every_page_reads_at_a_glance(server):
    SHOTS.mkdir(parents=True, exist_ok=True)
    port = int(server.rsplit(":", 1)[1])
    views = [
        (f"{server}/{path}?run={run}", title, f"{run.split('/')[-1]}_{path or 'overview'}")
        for run in RUNS
        for path, title in PAGES.items()
    ]
    views.append((demo_view(DEMO, port), "Compare runs", "demo_view"))
    problems: dict[str, list[str]] = {}
    tiles = legends = inspect_buttons = 0
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": WIDTHS[0], "height": 1200})
            for url, title, shot in views:
                page.set_viewport_size({"width": WIDTHS[0], "height": 1200})
                page.goto(url)
                _settle(page, title)
                # each view is loaded once and checked at every width: the layout (columns, tiles,
                # plotly's autosized figures and legends) follows the window, the script does not rerun
                for width in WIDTHS:
                    where = f"{shot} at {width} px"
                    if width != WIDTHS[0]:
                        page.set_viewport_size({"width": width, "height": 1200})
                        page.wait_for_timeout(RELAYOUT_MS)
                    _no_error(page, where)
                    tiles += page.locator('[data-testid="stMetric"]').count()
                    inspect_buttons += page.get_by_role("button", name="Inspect tokens").count()
                    misplaced, checked = page.evaluate(MISPLACED_LEGENDS, LEGEND_REACH)
                    legends += checked
                    found = (
                        page.evaluate(CUT_TILES) + misplaced + page.evaluate(CUT_BUTTONS) + page.evaluate(CUT_TITLES)
                    )
                    if found:
                        problems[where] = found
                    _full_page_shot(page, width, SHOTS / f"{shot}_{width}.png")
            page.close()
        finally:
            browser.close()
    assert tiles > 0 and legends > 0 and inspect_buttons > 0
    assert problems == {}


def _checked(browser, html_file) -> tuple[list[str], int]:
    """The misplaced legends and cut titles of a static HTML page, and how many legends it has."""
    page = browser.new_page(viewport={"width": 1280, "height": 1200})
    try:
        page.goto(html_file.as_uri())
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .infolayer').length > 0")
        page.wait_for_timeout(500)
        misplaced, checked = page.evaluate(MISPLACED_LEGENDS, LEGEND_REACH)
        return misplaced + page.evaluate(CUT_TITLES), checked
    finally:
        page.close()


def test_report_legends_sit_beside_their_panels(tmp_path):
    """The report of the shipped collapse (its figures are the dashboard's) has no misplaced
    legend and no cut title; and the checks find both: the rules' legend of the collapse timeline
    moved beside the entropy panel, under a title too long to fit."""
    from trustlens import analysis as A
    from trustlens import plots
    from trustlens.report.page import build_report
    from trustlens.run import load_run

    run = load_run(SAMPLE / "pg_is")
    report = tmp_path / "report.html"
    report.write_text(build_report([run]), encoding="utf-8")
    signals = A.step_signals(run)
    moved = plots.collapse_timeline(signals, panels=("entropy", "reward"), title="a title " * 60)
    beside = {"orientation": "v", "x": 1.02, "xref": "paper", "y": 1.0, "yref": "paper", "yanchor": "top"}
    moved.update_layout(legend2=beside)
    control = tmp_path / "moved.html"
    control.write_text(moved.to_html(include_plotlyjs=True), encoding="utf-8")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            problems, checked = _checked(browser, report)
            assert checked >= 5 and problems == []
            problems, _ = _checked(browser, control)
            assert len(problems) == 2 and "legend2" in problems[0]
            assert "nearer another panel" in problems[0] or "px from its panels" in problems[0]
            assert problems[1].startswith("title cut: a title a title")
        finally:
            browser.close()
