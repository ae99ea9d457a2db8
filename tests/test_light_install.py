"""The light install (`pip install trustlens`, no torch) reads runs: load_run and every analysis
on the shipped sample runs, in a fresh venv where `import torch` fails."""

import json

import pytest
from light_install import REPO, light_python, run_light  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow  # builds a venv: 2–3 minutes (measured 133 s under load)

SAMPLE = REPO / "data" / "sample_run"

# Calls every analysis of trustlens.analysis (its __all__, the threshold sweep and the findings)
# on each sample run, filling required arguments by name; prints what ran as JSON.
ANALYSES = r"""
import inspect, json, sys
import polars as pl
from trustlens import load_run
import trustlens.analysis as analysis
from trustlens.analysis import paper_findings, seeds, sweep
from trustlens.analysis.certify import CertifyInputError

functions = {n: getattr(analysis, n) for n in analysis.__all__ if inspect.isfunction(getattr(analysis, n))}
functions["threshold_sweep"] = sweep.threshold_sweep
functions.update({n: f for n, f in vars(paper_findings).items()
                  if inspect.isfunction(f) and f.__module__ == paper_findings.__name__ and not n.startswith("_")})
ran, skipped = {}, {}
for path in sys.argv[1:]:
    run = load_run(path)
    names = list(run.rules)
    known = {"tokens": run.tokens, "run": run, "metrics": run.metrics, "samples": run.samples,
             "rules": names, "rule_a": names[0], "rule_b": names[1]}
    per_step = analysis.mismatch_per_step(run.tokens)
    known["per_step"] = per_step.collect() if isinstance(per_step, pl.LazyFrame) else per_step
    known["runs"] = [run]
    known["outcomes"] = analysis.run_outcomes([run])
    known["accuracy"] = seeds.accuracy_per_step(run)
    known["reward"] = seeds.reward_per_step(run)
    # arguments whose meaning depends on the function
    overrides = {"mismatch_trend": {"metrics": [c for c in known["per_step"].columns if c != "step"]}}
    for name, fn in functions.items():
        params = inspect.signature(fn).parameters.values()
        required = [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        given = known | overrides.get(name, {})
        missing = [r for r in required if r not in given]
        if missing:
            skipped[name] = missing
            continue
        try:
            out = fn(**{r: given[r] for r in required})
        except CertifyInputError as err:  # certify refuses a stale run (rollout_lag > 0): it ran, and said so
            out = f"refused: {err}"
        if isinstance(out, pl.LazyFrame):
            out = out.collect()
        ran.setdefault(name, []).append(out if isinstance(out, str) else type(out).__name__)
print(json.dumps({"ran": ran, "skipped": skipped}))
"""


def test_light_install_has_no_torch_and_reads_runs(light_python):  # noqa: F811 (the fixture)
    out = run_light(light_python, "import importlib.util as u; print(u.find_spec('torch') is None)")
    assert out.strip() == "True", "the light install pulled torch in"
    # torch-only features say which extra to install
    msg = run_light(
        light_python,
        "import trustlens\ntry:\n    trustlens.TokenRecorder\nexcept ImportError as e:\n    print(e)",
    )
    assert 'pip install "trustlens[torch]"' in msg
    runs = sorted(str(p) for p in SAMPLE.iterdir() if (p / "run.json").exists())
    assert runs, "no sample runs shipped"
    code = f"import sys; sys.argv[1:] = {runs!r}\n" + ANALYSES
    result = json.loads(run_light(light_python, code).strip().splitlines()[-1])
    assert not result["skipped"], f"analyses with required arguments the test cannot fill: {result['skipped']}"
    assert {"threshold_sweep", "detect_collapse", "mismatch_per_step", "blocked_per_step"} <= set(result["ran"])
    assert all(len(kinds) == len(runs) for kinds in result["ran"].values()), "an analysis did not run on every run"
    refused = [k for kinds in result["ran"].values() for k in kinds if k.startswith("refused")]
    assert all("rollout_lag" in k for k in refused), refused  # only certify, only on the stale sample runs
