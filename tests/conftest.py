import os

# Triton's kernels run under its interpreter, on CPU tensors, in every test: set before anything
# imports Triton (a test module, or a library one imports at collection, such as TRL).
os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

try:
    from hypothesis import settings
except ImportError:  # the trainer venvs of tests/integrations/run.sh install pytest, not [dev]
    pass
else:
    # property tests draw the same examples on every run: a CI run never fails on a fresh draw
    # that the last run did not see (widen max_examples locally to explore)
    settings.register_profile("trustlens", derandomize=True)
    settings.load_profile("trustlens")

# the local S3 server fixtures (s3_endpoint, s3) for the object-store tests
pytest_plugins = ["s3_server"]

# Tests run on 2 cores next to each other; keep torch from oversubscribing them.
torch.set_num_threads(1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded generator: every random test input is reproducible."""
    return torch.Generator().manual_seed(0)


@pytest.fixture
def rule_inputs(gen):
    """Random inputs of every rule: `make(b, t, dtype)` → log μ, log π, log π_old (b, t), advantages
    (b,) with A = 0 for sequence 0, top-K TV/KL a little above the binary ones (b, t), and a
    response mask (b, t) of responses 2 to t tokens long."""
    from trustlens.divergence import binary_kl, binary_tv

    def make(b: int = 6, t: int = 9, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
        mu = torch.log_softmax(torch.randn(b, t, 5, generator=gen, dtype=dtype) * 2, -1)[..., 0]
        pi = (mu + 0.6 * torch.randn(b, t, generator=gen, dtype=dtype)).clamp(max=-1e-3)
        old = (mu + 0.3 * torch.randn(b, t, generator=gen, dtype=dtype)).clamp(max=-1e-3)
        adv = torch.randn(b, generator=gen, dtype=dtype)
        adv[0] = 0.0
        lengths = torch.randint(2, t + 1, (b, 1), generator=gen)
        return dict(
            pi_logp=pi,
            mu_logp=mu,
            advantages=adv,
            old_logp=old,
            topk_tv=binary_tv(pi, mu) + 0.05 * torch.rand(b, t, generator=gen, dtype=dtype),
            topk_kl=binary_kl(pi, mu) + 0.02 * torch.rand(b, t, generator=gen, dtype=dtype),
            response_mask=torch.arange(t) < lengths,
        )

    return make


def pytest_collection_modifyitems(config, items):
    """The test files that drive Chromium run first. They are the longest files and mostly wait on
    the browser, so under the default run's two workers (pyproject addopts: -n 2 --dist loadfile)
    the short CPU-bound files fill both workers' time after them instead of one worker finishing
    a browser file alone at the end. The order within a file is kept."""
    browser_files = {item.path for item in items if item.get_closest_marker("browser")}
    items.sort(key=lambda item: item.path not in browser_files)
