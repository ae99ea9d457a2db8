"""The doctor's scalar checks on an imported (metrics-only) run: the mismatch level against the
model kind's range, and the staleness hint (trustlens.analysis.scalar_doctor)."""

import json

import pytest

from trustlens import load_run
from trustlens.analysis.diagnosis.level import K3_RANGE
from trustlens.analysis.scalar_doctor import scalar_findings
from trustlens.ingest import import_log


def _run(tmp_path, k3: float, *, extra: dict | None = None, model_kind: str | None = None):
    path = tmp_path / f"log-{k3}-{model_kind}-{bool(extra)}.jsonl"
    rows = [
        {"step": s, "data": {"rollout_corr/k3_kl": k3, "actor/entropy": 0.5, **(extra or {})}} for s in range(1, 11)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / path.stem
    import_log(path, out, model_kind=model_kind)
    return load_run(out)


@pytest.mark.parametrize(
    ("k3", "kind", "verdict", "words"),
    [
        (5e-4, None, "ok", "within the published range"),
        (1e-6, None, "ok", "below the published range"),
        (5e-3, None, "warning", "above the published range"),
        (5e-2, None, "problem", "above the published range"),
        (5e-2, "moe", "ok", "within the published range"),  # MoE's range is 1e-3–1e-1
    ],
)
def test_level_against_the_model_kind_s_range(tmp_path, k3, kind, verdict, words):
    (finding,) = scalar_findings(_run(tmp_path, k3, model_kind=kind))
    assert finding.check == "level" and finding.verdict == verdict and words in finding.summary
    assert finding.evidence["k3_kl"] == pytest.approx(k3) and finding.evidence["k3_range"] == list(
        K3_RANGE[kind or "dense"]
    )


def test_a_logged_staleness_turns_a_problem_into_a_warning_and_is_named(tmp_path):
    (finding,) = scalar_findings(_run(tmp_path, 5e-2, extra={"async/off_policy_level": 2.0}))
    assert finding.verdict == "warning"
    assert "stale rollouts (async/off_policy_level 2)" in finding.summary
    assert finding.evidence["staleness"] == {"async/off_policy_level": 2.0}
    (plain,) = scalar_findings(_run(tmp_path, 5e-3))
    assert "if rollouts came from older weights (async training)" in plain.summary


def test_no_mismatch_logged(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s, "data": {"actor/entropy": 0.5}}) + "\n" for s in range(3)))
    import_log(path, tmp_path / "run")
    (finding,) = scalar_findings(load_run(tmp_path / "run"))
    assert finding.verdict == "ok" and "no mismatch metric logged" in finding.summary


def test_doctor_command_on_an_imported_run_says_it_has_no_tokens(tmp_path, capsys):
    from trustlens.cli import main

    run = _run(tmp_path, 5e-3)
    assert main(["doctor", str(run.path)]) == 0
    out = capsys.readouterr().out
    assert out.count("recorded without per-token data: import shows scalars; attach the hook for tokens") == 1
    assert "above the published range" in out
