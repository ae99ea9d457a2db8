"""The CLI's messages on bad input, as a user meets them (issue 46): one line each, naming the thing
and the fix; the path checked before the port; a folder of runs answered with the runs inside; a
corrupt part file not explained as a run still being written, its warning without a source line;
a killed run named as such by `doctor`."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import torch

from trustlens.cli import main
from trustlens.live.watch import DEFAULT_STALE
from trustlens.record import TokenRecorder
from trustlens.run import load_run, writer_died
from trustlens.run.follow import STALE_SECONDS
from trustlens.synthetic import write_synthetic_run

# a synthetic run whose writer process is killed (os._exit: no close, no handler) after step 2
KILLED = """
import os, sys
from trustlens.synthetic import write_synthetic_run
write_synthetic_run(sys.argv[1], steps=6, samples_per_step=8, seq_len=4, rows_per_part=1,
                    on_step=lambda step: os._exit(9) if step == 2 else None)
"""


def _small_run(path, **kw):
    return write_synthetic_run(path, steps=2, samples_per_step=8, seq_len=4, **kw)


def _lines(text: str) -> list[str]:
    return text.splitlines()


def test_a_corrupt_part_file_is_named_as_unreadable_and_its_warning_is_one_line(tmp_path, capsys):
    run = _small_run(tmp_path / "run")
    (part,) = (run / "tokens").rglob("part-*.parquet")
    part.write_bytes(part.read_bytes()[:100])  # truncated: no footer
    assert main(["doctor", str(run)]) == 2
    warning, error = _lines(capsys.readouterr().err)
    assert warning.startswith(f"trustlens doctor: warning: skipping unreadable part file {part}: ")
    assert error == (
        f"trustlens doctor: error: run {str(run)!r} has no readable token rows: its 1 token part file(s) could not "
        f"be read (truncated or corrupt, e.g. {part}); restore them from a copy or record the run again"
    )


def test_the_library_warning_of_a_corrupt_part_points_at_the_callers_line(tmp_path):
    run = _small_run(tmp_path / "run")
    (part,) = (run / "samples").rglob("part-*.parquet")
    part.write_bytes(b"not parquet")
    with pytest.warns(UserWarning, match="skipping unreadable part file") as caught:
        load_run(run)
    assert [w.filename for w in caught] == [__file__]  # not trustlens/run/reader.py


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("README.md", "it is a file, not a directory; give a run's folder (the directory holding run.json)"),
        ("nope", "no such file or directory; give a run's folder (the directory holding run.json)"),
    ],
)
@pytest.mark.parametrize("command", ["doctor", "watch"])
def test_a_file_or_a_missing_path_is_not_called_a_missing_directory(tmp_path, capsys, command, name, says):
    (tmp_path / "README.md").write_text("# not a run\n")
    path = tmp_path / name
    assert main([command, str(path)]) == 2
    assert capsys.readouterr().err == f"trustlens {command}: error: {str(path)!r} is not a trustlens run: {says}\n"


def test_dashboard_checks_the_path_before_the_port(tmp_path, capsys):
    with socket.create_server(("127.0.0.1", 0)) as busy:  # the port is in use
        port = busy.getsockname()[1]
        assert main(["dashboard", str(tmp_path / "nope"), "--port", str(port)]) == 2
    assert capsys.readouterr().err == (
        f"trustlens dashboard: error: runs folder {str(tmp_path / 'nope')!r} does not exist: give a folder of "
        "recorded runs or one run (e.g. runs/), or no RUNS_DIR for the shipped sample run\n"
    )


def test_watch_on_a_folder_of_runs_names_the_runs_inside_as_doctor_does(tmp_path, capsys):
    for name in ("ppo", "pg_is"):
        _small_run(tmp_path / "runs" / name, status="running")
    runs = tmp_path / "runs"
    said = {}
    for command in ("watch", "doctor"):
        assert main([command, str(runs)]) == 2
        said[command] = capsys.readouterr().err.removeprefix(f"trustlens {command}: error: ")
    assert said["watch"] == said["doctor"]
    assert said["watch"].endswith(f"it is a folder of 2 runs: give those instead ({runs / 'pg_is'}, {runs / 'ppo'})\n")


def test_doctor_names_a_killed_run_incomplete_with_the_test_watch_uses(tmp_path, capsys):
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-c", KILLED, str(run)], check=False, timeout=120)
    assert load_run(run).status == "running"  # what a killed writer leaves
    assert writer_died(run, load_run(run).manifest) == "no writer holds it"
    assert main(["doctor", str(run)]) == 0
    first = _lines(capsys.readouterr().out)[0]
    assert first == (
        f"warning  run           run {str(run)!r} is incomplete: run.json still says running but no writer holds it "
        "(killed or crashed?); these findings cover steps up to 2 only: resume it (TokenRecorder(..., "
        "resume=True)) to record the rest"
    )
    assert main(["doctor", str(run), "--json"]) == 0  # stdout stays the JSON list; the note goes to stderr
    captured = capsys.readouterr()
    assert captured.out.startswith("[") and captured.err.startswith(f"trustlens doctor: warning: run {str(run)!r} is")
    assert main(["watch", str(run), "--every", "0.01"]) == 3  # watch says the same run stopped


def test_doctor_says_nothing_more_of_a_finished_run_and_names_an_interrupted_one(tmp_path, capsys):
    finished, interrupted = _small_run(tmp_path / "done"), _small_run(tmp_path / "stopped", status="interrupted")
    assert main(["doctor", str(finished)]) == 0
    assert not any(line.startswith("warning  run ") for line in _lines(capsys.readouterr().out))
    assert main(["doctor", str(interrupted)]) == 0
    first = _lines(capsys.readouterr().out)[0]
    says = f"run {str(interrupted)!r} is incomplete: it ended interrupted; these findings cover steps up to 1 only"
    assert first == f"warning  run           {says}"


def test_watch_and_writer_died_share_the_stale_default():
    assert DEFAULT_STALE == STALE_SECONDS


def test_doctor_names_a_run_still_being_written(tmp_path, capsys):
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:  # open: its writer holds the lock
        rec.record(
            0,
            token_ids=torch.zeros(2, 3, dtype=torch.long),
            response_mask=torch.ones(2, 3),
            pi_logp=torch.full((2, 3), -1.0),
            mu_logp=torch.full((2, 3), -1.1),
            advantages=torch.ones(2),
        )
        rec.flush()
        assert main(["doctor", str(tmp_path / "run")]) == 0
    first = _lines(capsys.readouterr().out)[0]
    assert first == (
        f"warning  run           run {str(tmp_path / 'run')!r} is still being written: these findings cover steps "
        "up to 0 only; run the doctor again when it finishes"
    )
