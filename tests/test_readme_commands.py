"""The README's Quick start: the first command installs only what the demo needs, the second adds
the test tools and runs the tests, and .ci/run runs exactly that test command."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, re.S)


def test_the_first_command_installs_the_demo_light():
    first, second = _quick_start_commands()[:2]
    assert '".[torch]"' in first and "[dev]" not in first and first.endswith("trustlens demo")
    assert "torch==2.13.0" in first
    # the words around it say which build PyPI gives on Linux and where the CPU build comes from
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "PyPI's `torch==2.13.0` is the CUDA build" in readme
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in readme
    assert '".[dev]"' in second


def test_ci_runs_the_readmes_test_command():
    test_command = _quick_start_commands()[1].split("&&")[-1].strip()
    assert test_command == "python -m pytest -q"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test_command in ci
