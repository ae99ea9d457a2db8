"""Eight first loads of a fresh dashboard at once, on a loaded machine.

Starts `--burners` CPU burners (`python -c 'while 1: pass'`, stopped at the end), then, for each
setting of how many page runs compute at once (app/busy.py, $TRUSTLENS_PAGES_AT_ONCE; the
default `auto` is one per core, at least two), serves a small synthetic run with a fresh
`trustlens.dashboard.start` and opens `--tabs` pages of it in headless Chromium at the same time.
Per setting it prints: how many tabs rendered (their title shown and Streamlit finished) within
`--timeout`, the seconds until the first and the last did, the seconds until each showed
something (the page or the busy note; the slowest), the slowest answer of the health check
polled every second meanwhile, and the last tab's time as a ratio of one first load on its own
(the baseline, measured first in the same run). The load average is printed before and after.

    python benchmarks/dashboard_load.py                        # 2 burners, auto and 8 at once
    python benchmarks/dashboard_load.py --burners 4 --at-once auto 2 8

Needs Debian chromium at /usr/bin/chromium and playwright.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from dashboard import ARGS, CHROMIUM, PAGES, _free_port

from trustlens import dashboard
from trustlens.synthetic import write_synthetic_run

# Streamlit has finished running the page's script
IDLE = "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
# app/busy.py's setting of the page runs computing at once
AT_ONCE_ENV = "TRUSTLENS_PAGES_AT_ONCE"
# the tabs opened at once: every page, then the two most used again
TABS = [*PAGES.items(), ("mismatch", "Mismatch"), ("", "Overview")]
# what a tab shows first: the page's title or the busy note (app/busy.py)
SHOWN = "() => !!document.querySelector('h1') || document.body.innerText.includes('The dashboard is busy')"


def _health(url: str, stop: threading.Event, slowest: list[float]) -> None:
    """Poll the health check every second until `stop`; keep the slowest answer (inf: none in 10 s)."""
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=10) as reply:
                reply.read()
            slowest[0] = max(slowest[0], time.perf_counter() - t0)
        except OSError:
            slowest[0] = float("inf")
        stop.wait(1.0)


def _loads(run: Path, tabs: list[tuple[str, str]], at_once: str, timeout: float) -> dict:
    """Open `tabs` of a fresh dashboard on `run` at once; what the module docstring lists."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    saved = os.environ.pop(AT_ONCE_ENV, None)  # dashboard.start passes the environment on
    if at_once != "auto":
        os.environ[AT_ONCE_ENV] = at_once
    try:
        proc = dashboard.start(run, port=port, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        os.environ.pop(AT_ONCE_ENV, None)
        if saved is not None:
            os.environ[AT_ONCE_ENV] = saved
    stop, slowest = threading.Event(), [0.0]
    shown: list[float] = []
    done: list[float] = []
    try:
        dashboard.wait_until_ready(proc, url, timeout=300)
        poller = threading.Thread(target=_health, args=(url, stop, slowest), daemon=True)
        poller.start()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            pages = [browser.new_page(viewport={"width": 1280, "height": 1000}) for _ in tabs]
            t0 = time.perf_counter()
            for page, (path, _) in zip(pages, tabs, strict=True):
                page.goto(f"{url}/{path}", wait_until="commit")
            for page in pages:
                left = max(1.0, timeout - (time.perf_counter() - t0))
                try:
                    page.wait_for_function(SHOWN, timeout=left * 1000)
                    shown.append(time.perf_counter() - t0)
                except PlaywrightTimeout:  # counted as not shown
                    pass
            for page, (_, title) in zip(pages, tabs, strict=True):
                left = max(1.0, timeout - (time.perf_counter() - t0))
                try:
                    page.get_by_role("heading", name=title).first.wait_for(timeout=left * 1000)
                    page.wait_for_function(IDLE, timeout=left * 1000)
                    done.append(time.perf_counter() - t0)
                except PlaywrightTimeout:  # counted as not rendered
                    pass
            browser.close()
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=60)
    return {
        "rendered": len(done),
        "first": min(done, default=float("nan")),
        "last": max(done, default=float("nan")),
        "shown": max(shown, default=float("nan")),
        "shown_n": len(shown),
        "health": slowest[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burners", type=int, default=2, help="CPU burners beside the dashboard [2]")
    parser.add_argument("--tabs", type=int, default=len(TABS), help=f"tabs opened at once [{len(TABS)}]")
    parser.add_argument("--at-once", nargs="+", default=["auto", "8"], help="page runs at once to try [auto 8]")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds a tab may take to render [240]")
    parser.add_argument("--tmp", type=Path, default=Path("/tmp/trustlens_bench_dashboard_load"))
    args = parser.parse_args()
    run = args.tmp / "one"
    if not (run / "run.json").exists():
        write_synthetic_run(run, steps=10, samples_per_step=16, seq_len=24, seed=0, collapse_at=6)
    tabs = (TABS * (args.tabs // len(TABS) + 1))[: args.tabs]
    burners = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.burners)]
    try:
        time.sleep(20)  # the load average follows in about a minute; the burners are busy at once
        print(f"{os.cpu_count()} cores, {args.burners} burners, load average before: {os.getloadavg()[0]:.1f}")
        base = _loads(run, tabs[:1], "auto", args.timeout)["last"]
        print(f"baseline: one first load on its own {base:.1f} s")
        print(
            f"{'at once':>8} {'rendered':>9} {'first s':>8} {'last s':>8} {'last/base':>10} {'all shown s':>12} "
            f"{'slowest health s':>17}"
        )
        for at_once in args.at_once:
            r = _loads(run, tabs, at_once, args.timeout)
            shown = f"{r['shown']:.1f}" if r["shown_n"] == len(tabs) else f"{r['shown_n']}/{len(tabs)}"
            print(
                f"{at_once:>8} {r['rendered']:>5}/{len(tabs):<3} {r['first']:>8.1f} {r['last']:>8.1f} "
                f"{r['last'] / base:>9.2f}x {shown:>12} {r['health']:>17.2f}",
                flush=True,
            )
        print(f"load average after: {os.getloadavg()[0]:.1f}")
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


if __name__ == "__main__":
    main()
