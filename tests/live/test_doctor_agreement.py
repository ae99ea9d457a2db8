"""Online = offline for the doctor: recorded runs replayed step by step through the live doctor
(`LiveMonitor`, the default `DoctorConfig`) end with the verdict `trustlens doctor` gives the
finished run, check by check: the shipped sample runs (the collapse preset: an fp8 engine 16 steps
stale, a sampled recording), every planted defect of benchmarks/doctor_detection.py (the checks
of issue 50 among them), a short trained run whose engine lags and a run resumed with an engine
that kept other weights. The live doctor's verdict of a check is the most severe it raised ("ok"
when it raised none); docs/doctor.md, "Live", says where the two could differ."""

from pathlib import Path

import pytest
import torch
from benchmark_scripts import load

from trustlens import TokenRecorder, load_run
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


def _record_steps(rec, steps, *, offset=None, seed=0):
    """Record `steps` of 16 responses × 12 tokens whose log μ is log π_old plus Gaussian noise
    (a bf16-like engine), and a fixed offset per token id where `offset` (V,) is given (an engine
    serving other weights)."""
    for step in steps:
        g = torch.Generator().manual_seed(seed * 1000 + step)
        ids = torch.randint(0, 16, (16, 12), generator=g)
        old = torch.log(torch.rand(16, 12, generator=g) * 0.85 + 0.05)
        shift = 0.01 * torch.randn(16, 12, generator=g) + (0 if offset is None else offset[ids])
        mu = torch.clamp(old + shift, max=-1e-4)
        rec.record(
            step,
            token_ids=ids,
            response_mask=torch.ones(16, 12),
            pi_logp=old,
            old_logp=old,
            mu_logp=mu,
            advantages=torch.linspace(-1, 1, 16),
        )


def test_a_resumed_run_whose_engine_kept_other_weights_gets_resume_live_and_offline(tmp_path):
    # recorded in two sessions: steps 0–5, then resumed (TokenRecorder(resume=True)) for 6–11 with
    # an engine that serves other weights (a fixed logit offset per token id): run.json says
    # resumed_after [5], and the live doctor names resume as the finished run's doctor does
    path = tmp_path / "run"
    with TokenRecorder(path, rules=["ppo"], config={"lr": 1e-3}) as rec:
        _record_steps(rec, range(6))
    offset = 0.3 * torch.randn(16, generator=torch.Generator().manual_seed(1))
    with TokenRecorder(path, rules=["ppo"], resume=True) as rec:
        _record_steps(rec, range(6, 12), offset=offset)
    run = load_run(path)
    assert run.manifest["resumed_after"] == [5]
    first = doctor(run)[0]
    assert (first.check, first.verdict) == ("resume", "problem") and "step 6" in first.summary
    _agree(path)
    # the clean twin: resumed the same way with the engine's own weights
    clean = tmp_path / "clean"
    with TokenRecorder(clean, rules=["ppo"], config={"lr": 1e-3}) as rec:
        _record_steps(rec, range(6))
    with TokenRecorder(clean, rules=["ppo"], resume=True) as rec:
        _record_steps(rec, range(6, 12))
    assert {f.check: f.verdict for f in doctor(clean)}["resume"] == "ok"
    _agree(clean)
