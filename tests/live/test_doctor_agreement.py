"""Online = offline for the doctor: recorded runs replayed step by step through the live doctor
(`LiveMonitor`, the default `DoctorConfig`) end with the verdict `trustlens doctor` gives the
finished run, check by check: the shipped sample runs (the collapse preset: an fp8 engine 16 steps
stale, a sampled recording), every planted defect of benchmarks/doctor_detection.py and a short
trained run whose engine lags. The live doctor's verdict of a check is the most severe it raised
("ok" when it raised none); docs/doctor.md, "Live", says where the two could differ."""

from pathlib import Path

import pytest
from benchmark_scripts import load

from trustlens import load_run
from trustlens.analysis import doctor
from trustlens.live import LiveMonitor
from trustlens.live.alert import severity_rank
from trustlens.live.monitor import replay
from trustlens.train.config import config_from_preset
from trustlens.train.trainer import train

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample_run"
bench = load("doctor_detection")


def _agree(path) -> None:
    run = load_run(path)
    live: dict[str, str] = {}
    for _, alerts in replay(run, LiveMonitor.for_run(run, None)):
        for a in alerts:
            if severity_rank(a.severity) >= severity_rank(live.get(a.kind, "warning")):
                live[a.kind] = a.severity
    offline = {f.check: f.verdict for f in doctor(run)}
    assert {check: live.get(check, "ok") for check in offline} == offline
    assert set(live) <= set(offline)


@pytest.mark.parametrize("name", ["pg_is", "ppo", "dppo_binary_tv", "learning"])
def test_the_shipped_runs_get_the_same_findings_live_and_offline(name):
    _agree(SAMPLE / name)


@pytest.mark.parametrize("defect", ["clean", *bench.DEFECTS])
def test_each_planted_defect_gets_the_same_findings_live_and_offline(tmp_path, defect):
    _agree(bench.write_planted(tmp_path / defect, defect, 1))


def test_a_trained_run_whose_engine_lags_gets_the_same_findings_live_and_offline(tmp_path):
    cfg = config_from_preset("quick", steps=6, eval_size=0, rollout_lag=2, lr=1e-3, temperature=0.5)
    train(cfg, tmp_path / "run", progress=False)
    run = load_run(tmp_path / "run")
    assert "pi_logp_raw" in run.tokens.collect_schema().names()  # the temperature check's logits form
    temperature = {f.check: f for f in doctor(run)}["temperature"]
    assert temperature.verdict == "ok" and temperature.evidence["stale"].startswith("rollout_lag 2")
    _agree(tmp_path / "run")
