import os

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
