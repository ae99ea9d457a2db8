"""`trustlens dashboard s3://bucket/prefix`: the dashboard lists and opens runs stored on a local
S3 server (moto on 127.0.0.1, tests/s3_server.py), every page without an error, in Chromium."""

import pytest
from s3_server import BUCKET
from test_dashboard_browser import CHROMIUM, PAGES, _browser, _no_error, _run_shown, _served, _settle, playwright

from trustlens import dashboard
from trustlens.synthetic import write_synthetic_run

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.is_file(), reason="Debian chromium not installed at /usr/bin/chromium"),
]


def test_runs_location_names_what_is_missing(s3, tmp_path):
    url = f"s3://{BUCKET}/runs"
    with pytest.raises(FileNotFoundError, match="nothing stored at 's3://trustlens-test/runs'"):
        dashboard.runs_location(url)
    write_synthetic_run(f"{url}/exp", steps=2, samples_per_step=8, seq_len=4)
    assert dashboard.runs_location(url) == url
    assert dashboard.runs_location(f"file://{tmp_path}") == str(tmp_path.resolve())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        dashboard.runs_location(tmp_path / "absent")


def test_every_page_of_a_run_on_s3(s3, tmp_path):
    write_synthetic_run(f"s3://{BUCKET}/team/exp-a", steps=6, samples_per_step=8, seq_len=12, seed=1, collapse_at=4)
    write_synthetic_run(f"s3://{BUCKET}/team/exp-b", steps=6, samples_per_step=8, seq_len=12, seed=2)
    with _served(f"s3://{BUCKET}/team", tmp_path) as url, playwright.sync_playwright() as p:
        browser = _browser(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            for path, title in PAGES.items():
                page.goto(f"{url}/{path}?run=exp-b")
                _settle(page, title)
                _no_error(page, f"{title} on S3")
                assert _run_shown(page) == "exp-b"
            page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"] button').first.click()
            assert {"exp-a", "exp-b"} <= {o.inner_text() for o in page.get_by_role("option").all()}
        finally:
            browser.close()
    assert not (tmp_path / "s3:").exists()
