"""The dashboard on the light install (no torch): every page of the installed app opened through
Streamlit's AppTest on each shipped sample run, in a fresh venv where `import torch` fails, with
a rule the run did not record decided on its columns on the PPO vs DPPO page."""

import json

import pytest
from light_install import light_python, run_light  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow  # builds a venv (2–3 minutes) unless the session already has one

PAGES = r"""
import json, os, sys
from streamlit.testing.v1 import AppTest
from trustlens import dashboard
from trustlens.run import load_runs

root = dashboard.default_runs()
os.environ[dashboard.RUNS_ENV] = str(root)
entry = str(dashboard.app_dir() / dashboard.ENTRY)
pages = ["views/overview.py", "views/token_inspector.py", "views/ppo_vs_dppo.py", "views/mismatch.py",
         "views/collapse.py", "views/compare.py"]
opened = []
for run in load_runs(root):
    name = str(run.path.relative_to(root))
    for page in pages:
        at = AppTest.from_file(entry, default_timeout=300).run()
        at.sidebar.selectbox(key="tl_run").set_value(name).run()
        at.switch_page(page).run()
        problems = [e.message for e in at.exception] + [e.value for e in at.error]
        assert not problems, (name, page, problems)
        if page == "views/ppo_vs_dppo.py":
            decided = [o for o in at.selectbox(key="pv_b").options if "(decided" in o]
            assert decided, (name, "no rule to decide on the columns")
            at.selectbox(key="pv_b").set_value(decided[0].split(" ")[0]).run()
            problems = [e.message for e in at.exception] + [e.value for e in at.error]
            assert not problems, (name, decided[0], problems)
        opened.append([name, page])
print(json.dumps({"opened": opened, "torch": "torch" in sys.modules}))
"""


def test_every_page_without_torch(light_python):  # noqa: F811 (the fixture)
    out = json.loads(run_light(light_python, PAGES, timeout=1200).strip().splitlines()[-1])
    assert out["torch"] is False
    runs = {name for name, _ in out["opened"]}
    assert len(runs) >= 3 and len(out["opened"]) == 6 * len(runs)
