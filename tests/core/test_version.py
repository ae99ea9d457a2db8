"""trustlens.__version__ is the version pyproject.toml gives the package (both are written by hand)."""

from __future__ import annotations

import re
from pathlib import Path

import trustlens
from trustlens.core.version import __version__


def test_the_version_is_pyprojects():
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    (version,) = re.findall(r'(?m)^version = "([^"]+)"$', pyproject)
    assert __version__ == trustlens.__version__ == version
