"""A mixture-of-experts run in Chromium (issue 49.6): the Overview's flipped-token tile, the
Mismatch page's "By routing" map and table, and the token inspector's flipped layers with the two
expert sets, on a small run written through TokenRecorder whose token text is hostile markup."""

from __future__ import annotations

import pytest
import torch
from test_dashboard_browser import CHROMIUM, _browser, _no_error, _served, _settle

from trustlens import TokenRecorder

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.is_file(), reason="Debian chromium not installed at /usr/bin/chromium"),
]
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

HOSTILE = "<img src=x onerror=window.__tl_pwned=3>"


class Tokenizer:
    def decode(self, ids: list[int]) -> str:
        return HOSTILE if ids[0] == 1 else f"t{ids[0]}"


def write_moe_run(path) -> None:
    """3 steps of 4 responses × 6 tokens, 3 layers (layer 0 dense), top-2 of 8 experts; the
    trainer routes every other token's layer 2 to expert 7 instead of the engine's second."""
    g = torch.Generator().manual_seed(0)
    with TokenRecorder(path, rules=["ppo"], tokenizer=Tokenizer(), model_kind="moe") as rec:
        for step in range(3):
            mu_experts = torch.stack([torch.randperm(6, generator=g)[:2] for _ in range(4 * 6 * 3)]).view(4, 6, 3, 2)
            mu_experts[:, :, 0] = -1
            pi_experts = mu_experts.clone()
            pi_experts[:, ::2, 2, 1] = 7
            mu_logp = -torch.rand(4, 6, generator=g) - 0.5
            rec.record(
                step,
                token_ids=torch.randint(0, 4, (4, 6), generator=g),
                response_mask=torch.ones(4, 6),
                pi_logp=mu_logp - 0.3 * (pi_experts != mu_experts).any(-1).any(-1),
                mu_logp=mu_logp,
                advantages=torch.randn(4, generator=g),
                mu_routed_experts=mu_experts,
                pi_routed_experts=pi_experts,
                num_experts=8,
            )


@pytest.fixture(scope="module")
def moe_server(tmp_path_factory):
    runs = tmp_path_factory.mktemp("moe_runs")
    write_moe_run(runs / "moe")
    with _served(runs, tmp_path_factory.mktemp("moe_log")) as url:
        yield url


def test_routing_views_of_an_moe_run(moe_server):
    with playwright.sync_playwright() as p:
        browser = _browser(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.goto(moe_server)
            _settle(page, "Overview")
            _no_error(page, "the Overview of an MoE run")
            # the tile row can appear after the status widget has gone (a later rerun): wait for it
            page.wait_for_function("() => document.body.innerText.includes('Flipped tokens · run')", timeout=60_000)
            page.goto(f"{moe_server}/mismatch")
            _settle(page, "Mismatch")
            _no_error(page, "the Mismatch page of an MoE run")
            page.get_by_role("heading", name="By routing").first.wait_for(timeout=30_000)
            assert "50.0% of the tokens were routed to other experts" in page.inner_text("body")
            page.goto(f"{moe_server}/token_inspector")
            _settle(page, "Token inspector")
            _no_error(page, "the token inspector of an MoE run")
            assert "3 of these tokens were routed to other experts by the trainer" in page.inner_text("body")
            assert page.evaluate("() => window.__tl_pwned === undefined"), "injected markup ran"
            assert page.locator("img[src=x]").count() == 0
        finally:
            browser.close()
