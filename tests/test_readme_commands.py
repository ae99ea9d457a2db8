"""The README's Quick start: the CPU-only torch line first, then the command that installs only
what the demo needs, then the one that adds the test tools and runs the tests, which .ci/run runs
exactly; and the browser the browser tests drive."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, re.S)


def test_the_demo_command_installs_the_demo_light_after_the_cpu_torch_line():
    cpu, demo, tests = _quick_start_commands()[:3]
    # the CPU-only torch comes first: a copy-paste of the demo command would otherwise pull CUDA
    assert cpu.endswith("pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu")
    assert cpu.startswith("python3 -m venv .venv && . .venv/bin/activate")
    assert '".[torch]"' in demo and "[dev]" not in demo and demo.endswith("trustlens demo")
    assert "torch==2.13.0" in demo
    # the words before it say which build PyPI gives on Linux
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.index("PyPI's `torch==2.13.0` is the CUDA build") < readme.index(cpu) < readme.index(demo)
    assert '".[dev]"' in tests


def test_the_readme_names_the_browser_the_browser_tests_need():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "Chromium at\n`/usr/bin/chromium`" in readme or "Chromium at `/usr/bin/chromium`" in readme
    browser = (ROOT / "tests" / "test_dashboard_browser.py").read_text(encoding="utf-8")
    assert 'CHROMIUM = Path("/usr/bin/chromium")' in browser


def test_ci_runs_the_readmes_test_command():
    test_command = _quick_start_commands()[2].split("&&")[-1].strip()
    assert test_command == "python -m pytest -q"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test_command in ci
