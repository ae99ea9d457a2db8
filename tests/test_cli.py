import subprocess
import sys

import pytest

from trustlens.cli import COMMANDS


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout


def test_top_level_help_lists_every_command_without_importing_torch():
    out = _run(
        "import sys, contextlib, io\n"
        "from trustlens.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(buf.getvalue())\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    for name in COMMANDS:
        assert name in out
    assert "torch imported: False" in out


def test_a_command_imports_only_its_own_module():
    out = _run(
        "import sys\n"
        "from trustlens.cli import main\n"
        "try:\n"
        "    main(['dashboard', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('warmup imported:', 'trustlens.train.warmup' in sys.modules)\n"
    )
    assert "usage: trustlens dashboard" in out
    assert "warmup imported: False" in out


def test_claims_measures_recorded_runs(tmp_path, capsys):
    """`trustlens claims --no-train` on finished runs of two rules × two seeds (synthetic, one collapsing)."""
    import polars as pl

    from trustlens.cli import main
    from trustlens.synthetic import write_synthetic_run

    for rule in ("ppo", "dppo_binary_tv"):
        for seed in (0, 1):
            write_synthetic_run(
                tmp_path / f"{rule}-seed{seed}",
                steps=12,
                samples_per_step=16,
                seq_len=8,
                rules=["ppo", "dppo_binary_tv"],
                active_rule=rule,
                seed=seed,
                collapse_at=6 if (rule, seed) == ("ppo", 1) else None,
            )
    assert main(["claims", "--no-train", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    report = (tmp_path / "claims.md").read_text()
    for key in ("C1", "C2", "C3", "C4", "C5", "C6"):
        assert f"## {key}" in report and f"\n{key} " in "\n" + out
    assert "untestable" in report  # no pg_is, cispo, top-K or recompute runs here
    assert (tmp_path / "figures" / "C1.html").is_file()
    per_run = report.split("## Per run")[1]
    assert per_run.count("\n| ppo | ") == 2 and per_run.count("\n| dppo_binary_tv | ") == 2
    table = pl.read_csv(tmp_path / "compare.csv")
    assert table["rule"].to_list() == ["dppo_binary_tv", "ppo"] and table["n"].to_list() == [2, 2]


@pytest.mark.parametrize("command", ["report", "export"])
def test_a_folder_of_runs_is_refused_naming_the_runs_inside(tmp_path, capsys, command):
    from trustlens.cli import main
    from trustlens.synthetic import write_synthetic_run

    for name in ("ppo", "pg_is"):
        write_synthetic_run(tmp_path / "runs" / name, steps=2, samples_per_step=8, seq_len=4)
    out = tmp_path / "out"
    argv = [
        command,
        str(tmp_path / "runs"),
        *(["--to", "tensorboard", str(out)] if command == "export" else ["-o", str(out)]),
    ]
    assert main(argv) == 2
    runs = tmp_path / "runs"
    assert capsys.readouterr().err == (
        f"trustlens {command}: error: {str(runs)!r} is not a trustlens run: it has no run.json (a run directory "
        f"is written by trustlens.TokenRecorder); it is a folder of 2 runs: give those instead ({runs / 'pg_is'}, "
        f"{runs / 'ppo'})\n"
    )
    assert not out.exists()


def test_export_usage_puts_the_runs_first(capsys):
    """`--to` takes one or two words, so the usage line shows the runs before it (the order that works)."""
    from trustlens.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["export", "--help"])
    assert exit_.value.code == 0
    usage = "usage: trustlens export RUN [RUN ...] --to {tensorboard LOGDIR | wandb [PROJECT]}"
    assert usage in capsys.readouterr().out
