"""How fast the dashboard's pages render on a large run, and how much memory the app holds.

Serves a small synthetic run (the baseline, ~100k tokens) and a large one (default ~10M tokens)
with `trustlens.dashboard.start`, opens every page twice in headless Chromium (first visit: the
run's queries are computed; repeat visit: served from the app's caches) plus a new token-text
search on the token inspector, and prints the seconds from navigation until Streamlit has
finished the page, the large/small ratio, and the Streamlit process's peak resident memory (VmHWM).

    python benchmarks/dashboard.py                     # generates the runs under /tmp
    python benchmarks/dashboard.py --run PATH          # an existing large run (or runs folder)

Needs Debian chromium at /usr/bin/chromium and playwright. Goals: every page ≤ 2 s after the
first load on the 10M-token run with the app process ≤ 2 GB; every page ≤ 2 s after the first on a
sampled 10⁹-token run (benchmarks/synthetic_run.py --tokens 1e9 --keep-rate 0.01; numbers in
docs/run-format.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path

from trustlens import dashboard
from trustlens.synthetic import expected_token_rows, write_synthetic_run

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PAGES = {
    "": "Overview",
    "token_inspector": "Token inspector",
    "ppo_vs_dppo": "PPO vs DPPO",
    "mismatch": "Mismatch",
    "collapse": "Collapse signals",
    "compare": "Compare runs",
}
SEARCH = "answer"  # a token-text search typed into the sidebar of the token inspector
Timing = tuple[float, float]  # (browser wall seconds, server CPU seconds)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peak_rss_mb(pid: int) -> float:
    """Peak resident memory of process `pid` (VmHWM), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time process `pid` has used so far, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _settle(page, title: str) -> None:
    page.get_by_role("heading", name=title).first.wait_for(timeout=600_000)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=600_000)


def _rerun(page, action) -> None:
    """Do `action` and wait until Streamlit has started the rerun it causes."""
    action()
    with contextlib.suppress(Exception):  # the rerun may finish before its status widget shows
        page.wait_for_selector('[data-testid="stStatusWidget"]', timeout=3000)


def _wait_idle(pid: int, quiet: float = 0.05) -> Timing:
    """Wait until the server uses < `quiet` CPU seconds per second; (wall s, CPU s) waited."""
    t0, c0 = time.perf_counter(), _cpu_seconds(pid)
    last = c0
    while True:
        time.sleep(1.0)
        now = _cpu_seconds(pid)
        if now - last < quiet:
            return time.perf_counter() - t0, now - c0
        last = now


def _timed(action, page, title: str, pid: int) -> tuple[float, float]:
    """(wall seconds in the browser, CPU seconds of the server) until `title` is shown, settled."""
    t0, c0 = time.perf_counter(), _cpu_seconds(pid)
    action()
    _settle(page, title)
    return time.perf_counter() - t0, _cpu_seconds(pid) - c0


def measure(run: Path) -> tuple[dict[str, tuple[Timing, Timing]], float]:
    """{page: (first visit, repeat visit)} and the server's peak RSS (MB) for `run`."""
    from playwright.sync_api import sync_playwright

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = dashboard.start(run, port=port, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times: dict[str, tuple[Timing, Timing]] = {}
    nan = (float("nan"), float("nan"))
    try:
        dashboard.wait_until_ready(proc, url, timeout=300)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            # the first page computes its queries; the app then warms the other pages' caches in
            # the background, which the user's first look at the overview gives time to finish
            first = {"": _timed(lambda: page.goto(url), page, PAGES[""], proc.pid)}
            warm_up = _wait_idle(proc.pid)
            first |= {
                path: _timed(lambda p=path: page.goto(f"{url}/{p}"), page, title, proc.pid)
                for path, title in PAGES.items()
                if path
            }
            again = {
                path: _timed(lambda p=path: page.goto(f"{url}/{p}"), page, title, proc.pid)
                for path, title in PAGES.items()
            }
            times = {PAGES[path]: (first[path], again[path]) for path in PAGES}
            times["background warm-up after the first page"] = (warm_up, nan)
            page.goto(f"{url}/token_inspector")
            _settle(page, "Token inspector")
            box = page.get_by_role("textbox", name="Token text contains")
            search = _timed(
                lambda: _rerun(page, lambda: (box.fill(SEARCH), box.press("Enter"))), page, "Token inspector", proc.pid
            )
            times[f"token inspector, new search {SEARCH!r}"] = (search, nan)
            browser.close()
        rss = _peak_rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return times, rss


def _make(path: Path, steps: int, samples: int, seq_len: int) -> Path:
    if not (path / "run.json").exists():
        print(
            f"writing a synthetic run of ~{expected_token_rows(steps, samples, seq_len):,} tokens to {path}", flush=True
        )
        write_synthetic_run(
            path,
            steps=steps,
            samples_per_step=samples,
            seq_len=seq_len,
            updates=2,
            collapse_at=int(steps * 0.75),
            seed=0,
            progress=True,
        )
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, help="the large run (default: generate ~10M tokens under --tmp)")
    parser.add_argument("--tmp", type=Path, default=Path("/tmp/trustlens_bench_dashboard"))
    args = parser.parse_args()
    small = _make(args.tmp / "small", 40, 32, 104)
    large = args.run or _make(args.tmp / "large", 200, 512, 136)

    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    base, base_rss = measure(small)
    big, big_rss = measure(large)
    for k, what in enumerate(("browser wall seconds (machine load inflates these)", "server CPU seconds")):
        print(
            f"\n{what}\n{'page':<40} {'small first':>11} {'small again':>11} {'large first':>11} "
            f"{'large again':>11} {'again ratio':>11}"
        )
        for name in big:
            (sf, sa), (lf, la) = ((v[k] for v in base[name]), (v[k] for v in big[name]))
            ratio = la / sa if sa == sa and sa > 0 else lf / sf
            print(f"{name:<40} {sf:>10.2f}s {sa:>10.2f}s {lf:>10.2f}s {la:>10.2f}s {ratio:>10.2f}x")
    print(
        f"\npeak RSS of the Streamlit process: small run {base_rss:,.0f} MB, large run {big_rss:,.0f} MB "
        f"(ratio {big_rss / base_rss:.2f}x)"
    )
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
