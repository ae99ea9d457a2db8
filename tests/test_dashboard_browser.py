"""The real thing: `trustlens dashboard` served on localhost, every page opened in headless
Debian Chromium (driven by Playwright), no error box, hostile run text shown and never run.

Screenshots go to artifacts/browser/ at the repository root (git-ignored).
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trustlens import dashboard
from trustlens.run.parts import write_part
from trustlens.synthetic import HOSTILE_VOCAB, VOCAB, write_synthetic_run

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


class _served:
    """`trustlens dashboard RUNS --port P [flags]` in the background, as a context manager
    yielding its URL; the server is stopped on exit: the CLI and its Streamlit child, as one
    process group (a child left behind by a CLI killed after the timeout outlived its test)."""

    def __init__(self, runs: Path, logdir: Path, *flags: str):
        self.runs, self.logdir, self.flags = runs, logdir, flags

    def __enter__(self) -> str:
        port = _free_port()
        self.log = open(self.logdir / f"dashboard-{port}.log", "w+")
        exe = Path(sys.executable).parent / "trustlens"
        cli = [str(exe)] if exe.is_file() else [sys.executable, "-m", "trustlens.cli"]
        self.proc = subprocess.Popen(
            [*cli, "dashboard", str(self.runs), "--port", str(port), *self.flags],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{port}"
        try:
            dashboard.wait_until_ready(self.proc, self.url)
        except RuntimeError as err:
            self.log.seek(0)
            text = self.log.read()
            self.__exit__()
            pytest.fail(f"{err}:\n{text}")
        return self.url

    def __exit__(self, *exc) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):  # then SIGKILL, below
            self.proc.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):  # the group's stragglers, if any
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`trustlens dashboard RUNS --port P` serving a hostile run in the background; yields its URL.
    Terminating the command stops the Streamlit server it started."""
    runs = tmp_path_factory.mktemp("browser_runs")
    _hostile_run(runs)
    with _served(runs, tmp_path_factory.mktemp("log")) as url:
        yield url


def _settle(page, title: str) -> None:
    """Wait until the page shows `title` and Streamlit has finished running the script."""
    page.get_by_role("heading", name=title).first.wait_for(timeout=60_000)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=60_000)
    page.wait_for_timeout(500)  # let plotly draw


def _hostile_text_is_text(page) -> None:
    """The hostile tokens and prompt are on screen as literal text, and every token's hover text
    holds its values. st.html draws its block after the script has finished: wait for the tokens."""
    page.locator("span[title*='blocked by:']").first.wait_for(timeout=60_000)
    body = page.inner_text("body")
    assert "<script>alert(1)</script>" in body or "<img␣src=x␣onerror=alert(1)>" in body
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


# ---------------------------------------------------------------- navigation, address, offline, Host

SECOND = "b_second"  # a second run: pages must show it once it is picked, never the first


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """A dashboard on two collapsing runs; yields (url, first run's name)."""
    runs = tmp_path_factory.mktemp("two_runs")
    write_synthetic_run(runs / "a_first", steps=10, samples_per_step=16, seq_len=24, seed=1, collapse_at=6)
    write_synthetic_run(runs / SECOND, steps=10, samples_per_step=16, seq_len=24, seed=2, collapse_at=5)
    with _served(runs, tmp_path_factory.mktemp("log2")) as url:
        yield url


def _browser(p, *extra: str):
    return p.chromium.launch(executable_path=str(CHROMIUM), args=[*ARGS, *extra], headless=True)


def _no_error(page, where: str) -> None:
    for box in ("stException", "stAlertContentError"):
        found = page.locator(f'[data-testid="{box}"]')
        assert found.count() == 0, f"{box} on {where}: {found.first.inner_text()[:2000]}"


def _run_box(page):
    """The sidebar's run picker: the select box labelled "Run" (found by its label, not by its place,
    so a page still drawing its other select boxes does not answer for it)."""
    box = page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').filter(
        has=page.locator("label", has_text="Run")
    )
    box.first.wait_for(timeout=30_000)
    return box.first


def _run_shown(page) -> str:
    """The run the sidebar's picker shows."""
    return _run_box(page).locator("input").input_value()


def _grid_rows(page, nth: int = 0) -> int:
    """Data rows of the nth table on the page (the grid's aria-rowcount, header excluded)."""
    grid = page.locator('[data-testid="stDataFrame"] [role="grid"]').nth(nth)
    grid.wait_for(state="attached", timeout=30_000)
    return int(grid.get_attribute("aria-rowcount")) - 1


def test_inspect_tokens_opens_the_selected_run(two_runs):
    with playwright.sync_playwright() as p:
        browser = _browser(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.goto(f"{two_runs}/collapse")
            _settle(page, "Collapse signals")
            assert "a_first" in _run_shown(page)
            # pick the second run in the sidebar, then follow an alert to its tokens
            _run_box(page).locator("button").first.click()
            page.get_by_role("option", name=SECOND).click()
            _settle(page, "Collapse signals")
            assert SECOND in _run_shown(page) and f"run={SECOND}" in page.url
            page.get_by_role("button", name="Inspect tokens").first.click()
            _settle(page, "Token inspector")
            _no_error(page, "the token inspector after an alert")
            assert SECOND in _run_shown(page), "the inspector opened another run than the one selected"
            assert f"Run {SECOND}" in page.inner_text("body")
            assert _grid_rows(page, 0) > 0, "the alert's driving-token table is empty"
            # the chart control and the PPO vs DPPO buttons keep the run too
            page.goto(f"{two_runs}/ppo_vs_dppo?run={SECOND}")
            _settle(page, "PPO vs DPPO")
            page.get_by_role("button", name="Inspect tokens blocked by only").first.click()
            _settle(page, "Token inspector")
            assert SECOND in _run_shown(page)
            _no_error(page, "the token inspector after PPO vs DPPO")
        finally:
            browser.close()


def test_address_restores_the_view(two_runs):
    with playwright.sync_playwright() as p:
        browser = _browser(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.goto(f"{two_runs}/mismatch?run={SECOND}&steps=2-5")
            _settle(page, "Mismatch")
            _no_error(page, "Mismatch from an address")
            assert SECOND in _run_shown(page)
            slider = page.locator('[data-testid="stSidebar"] [data-testid="stSlider"]').first
            assert "2" in slider.inner_text() and "5" in slider.inner_text()
            page.reload()
            _settle(page, "Mismatch")
            assert SECOND in _run_shown(page) and "steps=2-5" in page.url and "/mismatch" in page.url
            # the runs compared live in the address too
            page.goto(f"{two_runs}/compare?run={SECOND}&compare={SECOND}")
            _settle(page, "Compare runs")
            chips = page.locator('[data-testid="stMultiSelect"]').first.inner_text()
            assert SECOND in chips and "a_first" not in chips
            page.reload()
            _settle(page, "Compare runs")
            assert "a_first" not in page.locator('[data-testid="stMultiSelect"]').first.inner_text()
            page.goto(f"{two_runs}/mismatch?run={SECOND}&steps=2-5")
            _settle(page, "Mismatch")
            # a fresh tab on the same link shows the same view
            other = browser.new_page(viewport={"width": 1400, "height": 1400})
            other.goto(page.url)
            _settle(other, "Mismatch")
            assert SECOND in _run_shown(other)
            slider = other.locator('[data-testid="stSidebar"] [data-testid="stSlider"]').first
            assert "2" in slider.inner_text() and "5" in slider.inner_text()
        finally:
            browser.close()


def test_no_request_leaves_the_machine(two_runs):
    requests: list[str] = []
    with playwright.sync_playwright() as p:
        browser = _browser(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.on("request", lambda r: requests.append(r.url))
            for path, title in PAGES.items():
                page.goto(f"{two_runs}/{path}")
                _settle(page, title)
                _no_error(page, title)
            page.wait_for_timeout(1500)
        finally:
            browser.close()
    outside = [u for u in requests if not u.startswith((two_runs, "data:", "blob:", "about:"))]
    assert requests and outside == [], f"requests left the machine: {sorted(set(outside))}"
    favicon = [u for u in requests if "icon" in u.lower()]
    assert favicon, "the local page icon was never requested"


# round 0: one burst of eight tabs on the fresh server; round 1 (slow): another seed, and a second
# burst on the warm server once the first tabs closed
@pytest.mark.parametrize("round_", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_eight_tabs_at_once_on_a_fresh_dashboard(tmp_path, round_):
    runs = tmp_path / "runs"
    write_synthetic_run(runs / "one", steps=10, samples_per_step=16, seq_len=24, seed=round_, collapse_at=6)
    paths = [*PAGES.items(), ("mismatch", "Mismatch"), ("", "Overview")]
    with _served(runs, tmp_path) as url, playwright.sync_playwright() as p:
        browser = _browser(p)
        try:
            for burst in range(1 + round_):
                tabs = [browser.new_page(viewport={"width": 1200, "height": 1000}) for _ in paths]
                for tab, (path, _) in zip(tabs, paths, strict=True):
                    tab.goto(f"{url}/{path}", wait_until="commit")
                for tab, (_, title) in zip(tabs, paths, strict=True):
                    _settle(tab, title)
                    _no_error(tab, f"{title} (burst {burst})")
                for tab in tabs:
                    tab.close()
        finally:
            browser.close()
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=10) as reply:
            assert reply.read().strip() == b"ok"  # the server still answers: no deadlock


def test_foreign_host_header_gets_only_an_error(two_runs):
    port = two_runs.rsplit(":", 1)[1]
    with playwright.sync_playwright() as p:
        # a page on a foreign name that resolves to this machine (DNS rebinding)
        browser = _browser(p, "--host-resolver-rules=MAP rebind.example 127.0.0.1")
        try:
            page = browser.new_page()
            page.goto(f"http://rebind.example:{port}/")
            page.get_by_text("only answers requests addressed to this machine").wait_for(timeout=60_000)
            page.wait_for_timeout(1000)
            body = page.inner_text("body")
            assert "a_first" not in body and SECOND not in body and "Overview" not in body
            assert page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').count() == 0
            # the same server still serves its own name
            page.goto(f"http://localhost:{port}/")
            _settle(page, "Overview")
        finally:
            browser.close()


# ---------------------------------------------------------------- first contact at 1,280 px

SAMPLE = ROOT / "data" / "sample_run"

# Every plotly figure on the page: its title, each trace's name and visibility, its plot area
# and its legends' boxes (px, page coordinates), and its panel titles that overlap a tick label.
FIGURES = """() => [...document.querySelectorAll('.js-plotly-plot')].map((gd) => {
  const g = gd.getBoundingClientRect(), full = gd._fullLayout;
  const box = (el) => { const b = el.getBoundingClientRect(); return {l: b.left, r: b.right, t: b.top, b: b.bottom}; };
  const hit = (a, b) => a.l < b.r && b.l < a.r && a.t < b.b && b.t < a.b;
  const ticks = [...gd.querySelectorAll('g.xtick text, g.ytick text')].map(box);
  return {
    title: (gd.querySelector('text.gtitle') || {}).textContent || '',
    traces: gd._fullData.map((t) => [t.name, t.visible]),
    plot: {l: g.left + full._size.l, r: g.left + full._size.l + full._size.w, b: g.top + full._size.t + full._size.h},
    legends: [...gd.querySelectorAll('g.infolayer > g[class^="legend"]')].map(box),
    clashes: [...gd.querySelectorAll('g.annotation text')].filter((a) => ticks.some((t) => hit(box(a), t)))
      .map((a) => a.textContent),
  };
})"""


# A run that records every built-in rule (22): the screens built for 12 must hold them.
ALL_RULES = "z_all_rules"

# The token inspector's legend: each chip's box (px), its ring's width beyond the box (a box-shadow
# or an outline and its offset) and the boxes of the badges inside it.
LEGEND = """() => {
  const legend = [...document.querySelectorAll('[data-testid="stHtml"] div')]
    .find((d) => d.innerText.includes('missing') && d.innerText.includes('blocked by'));
  const box = (el) => { const b = el.getBoundingClientRect(); return {l: b.left, r: b.right, t: b.top, b: b.bottom}; };
  return [...legend.children].map((chip) => {
    const s = chip.style;
    const ring = Math.max(parseFloat((s.boxShadow.match(/0px 0px 0px (\\d+)px/) || [0, 0])[1]),
                          (parseFloat(s.outlineWidth) || 0) + (parseFloat(s.outlineOffset) || 0));
    return {text: chip.innerText, ...box(chip), ring, badges: [...chip.children].map(box)};
  });
}"""

# The mask-confusion heatmap: its number of rules, its cell size and each printed count's size (px).
HEATMAP = """() => {
  const gd = [...document.querySelectorAll('.js-plotly-plot')]
    .find((g) => ((g.querySelector('text.gtitle') || {}).textContent || '').startsWith('Blocked by row rule'));
  if (!gd || !gd._fullData) return null;
  const full = gd._fullLayout, n = gd._fullData[0].x.length;
  return {n, w: full._size.w / n, h: full._size.h / n,
          texts: [...gd.querySelectorAll('g.hm text, g.heatmaplayer text')].map((t) => {
            const b = t.getBoundingClientRect(); return [t.textContent, b.width, b.height]; })};
}"""


@pytest.fixture(scope="module")
def learning(tmp_path_factory):
    """The dashboard on the shipped `learning` run (160 steps, 12 rules, active dppo_binary_tv),
    the shipped collapse and a small run of all 22 rules; yields its URL."""
    import shutil

    from trustlens.rules import RULES

    runs = tmp_path_factory.mktemp("first_contact")
    for name in ("learning", "pg_is"):
        shutil.copytree(SAMPLE / name, runs / name)
    write_synthetic_run(
        runs / ALL_RULES, steps=4, samples_per_step=16, seq_len=24, rules=list(RULES), seed=3, active_rule="ppo"
    )
    with _served(runs, tmp_path_factory.mktemp("log3")) as url:
        yield url


def _figures(page, count: int = 1) -> dict[str, dict]:
    """FIGURES of the page, by title, once `count` figures are drawn."""
    page.wait_for_function(
        "(n) => document.querySelectorAll('.js-plotly-plot .infolayer').length >= n", arg=count, timeout=60_000
    )
    page.wait_for_timeout(500)
    return {f["title"]: f for f in page.evaluate(FIGURES)}


def test_first_contact_at_1280_px(learning):
    """The Overview's tiles name their steps alike, its block-rate chart draws the active and the
    compared rule (the other ten one click away) with its legend under a wide plot, no panel
    title sits on a tick label; an unknown address says so; a token that many rules block has
    one ring and a count."""
    import polars as pl

    from trustlens.run import load_run

    with playwright.sync_playwright() as p:
        browser = _browser(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1600})
            page.goto(f"{learning}/?run=learning")
            _settle(page, "Overview")
            _no_error(page, "Overview")
            figures = _figures(page, 3)  # the block rates, the timeline, the accuracy: the tiles drawn
            labels = page.locator('[data-testid="stMetricLabel"]').all_inner_texts()
            assert "Reward · step 159" in labels and "Accuracy · after step 159" in labels, labels
            blocked = figures["Blocked fraction per step"]
            drawn = {name for name, visible in blocked["traces"] if visible is True}
            listed = {name for name, visible in blocked["traces"] if visible == "legendonly"}
            assert drawn == {"dppo_binary_tv", "ppo"} and len(listed) == 10
            plot = blocked["plot"]
            assert plot["r"] - plot["l"] > 600  # the legend takes no width from the plot ...
            assert all(legend["t"] >= plot["b"] for legend in blocked["legends"])  # ... it sits under it
            assert {t: f["clashes"] for t, f in figures.items() if f["clashes"]} == {}
            timeline = figures["Collapse signals"]  # beside the accuracy: the same two rules only
            assert {n for n, v in timeline["traces"] if v is True} >= drawn
            assert not any(n in listed for n, _ in timeline["traces"])
            page.screenshot(path=str(SHOTS / "overview_1280.png"), full_page=True)

            # the Collapse page's full-width timeline: the same two drawn, the rest listed
            page.goto(f"{learning}/collapse?run=pg_is")
            _settle(page, "Collapse signals")
            timeline = _figures(page)["Collapse signals"]
            rules = {n: v for n, v in timeline["traces"] if n in listed | drawn | {"pg_is"}}
            assert {n for n, v in rules.items() if v is True} == {"pg_is", "dppo_binary_tv"}
            assert timeline["clashes"] == []
            assert "driving tokens: ‹" in page.inner_text("body")  # tokens spelt as on every page

            # an address that names no page says so
            page.goto(f"{learning}/collapse_signals")
            _settle(page, "Overview")
            assert "No page at /collapse_signals: showing the Overview instead" in page.inner_text("body")
            assert page.get_by_text("No page at /collapse_signals").is_visible()
            assert page.locator('[role="dialog"]').count() == 0  # no pop-up of Streamlit's own over it

            # a token blocked by 9 rules: one dashed ring and the count
            tokens = load_run(SAMPLE / "learning").tokens
            columns = [c for c in tokens.collect_schema().names() if c.startswith("blocked_")]
            count = pl.sum_horizontal(pl.col(c).cast(pl.Int32) for c in columns)
            step, sample, many = (
                # on the update the inspector opens on: the sample's first
                tokens.filter((count > 2) & (pl.col("update") == pl.col("update").min().over("step", "sample")))
                .select("step", "sample", count.alias("n"))
                .sort("n", descending=True)
                .first()
                .collect()
                .row(0)
            )
            page.goto(f"{learning}/token_inspector?run=learning&step={step}&sample={sample}")
            _settle(page, "Token inspector")
            page.locator("span[title*='blocked by:']").first.wait_for(timeout=60_000)
            _no_error(page, "Token inspector")
            rings = page.evaluate(
                """() => [...document.querySelectorAll('span[title]')].filter((s) => s.style.outlineStyle === 'dashed')
                     .map((s) => [s.style.boxShadow, s.lastElementChild ? s.lastElementChild.textContent : null])"""
            )
            assert ["", str(many)] in [list(r) for r in rings], rings
            stacked = page.evaluate(
                "() => Math.max(0, ...[...document.querySelectorAll('span[title]')]"
                ".map((s) => s.style.boxShadow ? s.style.boxShadow.split('px,').length : 0))"
            )
            assert stacked <= 2  # never more than two rings stacked
            page.screenshot(path=str(SHOTS / "inspector_rings_1280.png"), full_page=True)

            # 22 rules: the legend's chips each on one line, their rings and badges clear of each other
            page.goto(f"{learning}/token_inspector?run={ALL_RULES}")
            _settle(page, "Token inspector")
            page.locator("span[title*='blocked by:']").first.wait_for(timeout=60_000)
            chips = page.evaluate(LEGEND)
            assert len(chips) == 3 + 22 + 1 and chips[-1]["text"].startswith("blocked by more than 2 rules")
            one_line = chips[2]["b"] - chips[2]["t"]  # "missing"
            assert all(abs(c["b"] - c["t"] - one_line) < 0.5 for c in chips), [c["text"] for c in chips]

            def ringed(c: dict) -> dict:
                return {k: c[k] + (c["ring"] if k in "rb" else -c["ring"]) for k in "lrtb"}

            def hit(a: dict, b: dict) -> bool:
                return a["l"] < b["r"] and b["l"] < a["r"] and a["t"] < b["b"] and b["t"] < a["b"]

            clashes = [
                (a["text"], b["text"]) for i, a in enumerate(chips) for b in chips[i + 1 :] if hit(ringed(a), ringed(b))
            ]
            assert clashes == []
            (badge,) = chips[-1]["badges"]  # the count badge sits inside its chip
            assert chips[-1]["l"] <= badge["l"] and badge["r"] <= chips[-1]["r"]
            assert chips[-1]["t"] <= badge["t"] and badge["b"] <= chips[-1]["b"]
            page.screenshot(path=str(SHOTS / "inspector_legend_22_rules_1280.png"))

            # the mask-confusion matrix: the chosen rules, each count inside its cell
            page.goto(f"{learning}/ppo_vs_dppo?run={ALL_RULES}")
            _settle(page, "PPO vs DPPO")
            page.wait_for_function(f"() => (({HEATMAP})() || {{texts: []}}).texts.length > 0", timeout=60_000)
            heatmap = page.evaluate(HEATMAP)
            assert 2 <= heatmap["n"] <= 10 and len(heatmap["texts"]) == heatmap["n"] ** 2
            too_big = [t for t in heatmap["texts"] if t[1] > heatmap["w"] - 2 or t[2] > heatmap["h"] - 2]
            assert too_big == [], (heatmap["w"], heatmap["h"], too_big[:5])
            assert "Rules in the matrix" in page.inner_text("body")  # the others one click away
        finally:
            browser.close()


def test_token_text_is_spelt_one_way(server):
    """The hostile run's tokens with spaces: ␣ in the inspector's response and its table."""
    with playwright.sync_playwright() as p:
        browser = _browser(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1600})
            page.goto(f"{server}/token_inspector")
            _settle(page, "Token inspector")
            page.locator("span[title*='blocked by:']").first.wait_for(timeout=60_000)
            shown = page.evaluate(
                "() => [...document.querySelectorAll('span[title]')].filter((s) => s.title.includes('blocked by:'))"
                ".map((s) => s.firstChild ? s.firstChild.textContent : '')"
            )
            assert shown and not any(" " in text for text in shown), shown
            assert any("␣" in text for text in shown) or "␣" in page.inner_text("body")
        finally:
            browser.close()
