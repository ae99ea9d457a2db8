"""`trustlens doctor RUN [--json]`: exit codes, the terminal listing and the JSON shape."""

import json

import pytest
from benchmark_scripts import load

from trustlens.analysis.diagnosis import CHECKS
from trustlens.cli import main

bench = load("doctor_detection")


@pytest.fixture(scope="module")
def sentinel_run(tmp_path_factory):
    return bench.write_planted(tmp_path_factory.mktemp("doctor") / "sentinel", "sentinel", 0)


def test_json_shape(sentinel_run, capsys):
    assert main(["doctor", str(sentinel_run), "--json"]) == 0
    findings = json.loads(capsys.readouterr().out)
    assert [set(f) for f in findings] == [{"check", "verdict", "summary", "evidence", "fix"}] * len(CHECKS)
    assert sorted(f["check"] for f in findings) == sorted(CHECKS)
    assert (findings[0]["check"], findings[0]["verdict"]) == ("sentinel", "problem")
    example = findings[0]["evidence"]["examples"][0]
    assert example["mu"] == 1.0 and 1e-3 <= example["old"] <= 0.5


def test_text_listing(sentinel_run, capsys):
    assert main(["doctor", str(sentinel_run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("PROBLEM  sentinel")
    assert any(line.strip().startswith("fix: mask the positions") for line in lines)
    assert sum(line.startswith(("PROBLEM", "warning", "ok")) for line in lines) == len(CHECKS)


def test_not_a_run_is_one_line_exit_2(tmp_path, capsys):
    assert main(["doctor", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trustlens doctor: error:") and err.count("\n") == 1
