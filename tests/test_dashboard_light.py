"""The dashboard on the light install (no torch): every page of the installed app opened through
Streamlit's AppTest on each shipped sample run, in a fresh venv where `import torch` fails, with
a rule the run did not record decided on its columns on the PPO vs DPPO page."""

import json

import pytest
from light_install import light_python, run_light  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow  # builds a venv (2–3 minutes) unless the session already has one

PAGES = r"""
import json, os, shutil, sys, tempfile
from pathlib import Path
import polars as pl
from streamlit.testing.v1 import AppTest
from trustlens import dashboard
from trustlens.run import load_runs

# the shipped sample runs, and a copy of one that did not record `dppo_binary_kl`: the PPO vs
# DPPO page decides that rule on the recorded columns
root = Path(tempfile.mkdtemp()) / "runs"
shutil.copytree(dashboard.default_runs(), root)
src = sorted(p for p in root.iterdir() if p.is_dir())[0]
copy = root / "without_binary_kl"
shutil.copytree(src, copy)
for part in copy.glob("tokens/rank=*/part-*.parquet"):
    pl.read_parquet(part).drop("blocked_dppo_binary_kl", strict=False).write_parquet(part)
manifest = json.loads((copy / "run.json").read_text())
manifest["rules"].pop("dppo_binary_kl", None)
(copy / "run.json").write_text(json.dumps(manifest))
os.environ[dashboard.RUNS_ENV] = str(root)
decided_on = []
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
            for option in at.selectbox(key="pv_b").options:
                if "(decided" in option:
                    rule = option.split(" · ", 1)[1].split(" ")[0]  # "level · rule (decided ...)"
                    at.selectbox(key="pv_b").set_value(rule).run()
                    problems = [e.message for e in at.exception] + [e.value for e in at.error]
                    assert not problems, (name, option, problems)
                    decided_on.append([name, rule])
        opened.append([name, page])
print(json.dumps({"opened": opened, "decided": decided_on, "torch": "torch" in sys.modules}))
"""


def test_every_page_without_torch(light_python):  # noqa: F811 (the fixture)
    out = json.loads(run_light(light_python, PAGES, timeout=1200).strip().splitlines()[-1])
    assert out["torch"] is False
    runs = {name for name, _ in out["opened"]}
    assert len(runs) >= 4 and len(out["opened"]) == 6 * len(runs)
    assert ["without_binary_kl", "dppo_binary_kl"] in out["decided"]
