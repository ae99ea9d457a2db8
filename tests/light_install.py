"""A fresh venv holding trustlens without torch (the light install), for the tests that use it.

`light_python` (a session fixture) builds it once per test session: `python -m venv`, then
`pip install <a copy of the repo>` — the base dependencies only, no extras; pip may take wheels
from its local cache. The copy leaves out build/ and *.egg-info, so that nothing stale from an
earlier in-tree build is installed. `run_light(python, code)` runs Python code in that venv from
a directory outside the repo (so the installed package is imported, not the source tree) and
returns its stdout; a failure raises with the child's output.

Use from a test module:

    from light_install import light_python, run_light  # noqa: F401  (light_python is a fixture)

    @pytest.mark.slow
    def test_something_without_torch(light_python):
        out = run_light(light_python, "import trustlens; print(trustlens.__version__)")
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# what a source distribution of the repo holds (pyproject's package and data files)
_SOURCES = ("pyproject.toml", "README.md", "trustlens", "app", "data")


def build_light_venv(root: Path) -> Path:
    """Create a venv under `root` with trustlens installed without extras; its python's path."""
    src = root / "src"
    for name in _SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(src)], cwd=root)
    return python


def run_light(python: Path, code: str, *, timeout: float = 600, cwd: Path | None = None) -> str:
    """Run `code` with the light venv's `python` (from `cwd`, default its venv's parent
    directory, outside the repo); its stdout. AssertionError with the output when it fails."""
    return _run([str(python), "-c", code], cwd=cwd or python.parents[2], timeout=timeout, what="code").stdout


def _run(args: list[str], *, cwd: Path, timeout: float = 1200, what: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        command = f"{args[0]} -c <{what}>" if what else " ".join(args)
        raise AssertionError(f"{command} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done


@pytest.fixture(scope="session")
def light_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a venv holding trustlens without torch (built once per session)."""
    return build_light_venv(tmp_path_factory.mktemp("light_install"))
