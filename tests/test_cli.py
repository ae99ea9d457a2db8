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


def _claims_runs(folder, seeds=(0, 1), **settings):
    """Synthetic finished runs of ppo and dppo_binary_tv on `seeds`, as FOLDER/<rule>-seed<S>."""
    from trustlens.synthetic import write_synthetic_run

    settings = dict(steps=12, samples_per_step=16, seq_len=8) | settings
    for rule in ("ppo", "dppo_binary_tv"):
        for seed in seeds:
            write_synthetic_run(
                folder / f"{rule}-seed{seed}", **settings, rules=["ppo", "dppo_binary_tv"], active_rule=rule, seed=seed
            )


def test_claims_measures_recorded_runs(tmp_path, capsys):
    """`trustlens claims --no-train` on finished runs of two rules × two seeds (synthetic, collapsing
    at step 6: the same settings for every run, as runs measured together need)."""
    import polars as pl

    from trustlens.cli import main

    _claims_runs(tmp_path, collapse_at=6)
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


def test_claims_no_train_leaves_out_runs_of_other_settings_and_says_which(tmp_path, capsys):
    """Four runs share their settings; one of other steps and one still running are left out,
    each named with the reason, on the terminal and in the report."""
    import polars as pl

    from trustlens.cli import main
    from trustlens.synthetic import write_synthetic_run

    _claims_runs(tmp_path)
    write_synthetic_run(
        tmp_path / "longer", steps=14, samples_per_step=16, seq_len=8, rules=["ppo", "dppo_binary_tv"], seed=2
    )
    write_synthetic_run(tmp_path / "partial", steps=2, samples_per_step=16, seq_len=8, status="running")
    assert main(["claims", "--no-train", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    longer = "longer (ppo, seed 2; not trained by `trustlens train`): steps=14; the measured runs have steps=12"
    partial = "partial: not finished (run.json status running)"
    assert out.startswith(
        f"measuring 4 runs in {tmp_path} (not trained by `trustlens train`), the largest set sharing their "
        f"settings apart from rule and seed\nleft out:\n  {partial}\n  {longer}\n"
    )
    report = (tmp_path / "claims.md").read_text()
    assert f"4 runs in `{tmp_path}` (not trained by `trustlens train`)" in report
    assert f"\n- {partial}\n- {longer}\n" in report
    table = pl.read_csv(tmp_path / "compare.csv")
    assert table["rule"].to_list() == ["dppo_binary_tv", "ppo"] and table["n"].to_list() == [2, 2]


def test_claims_no_train_refuses_a_rule_and_seed_twice_naming_both_folders(tmp_path, capsys):
    import shutil

    from trustlens.cli import main

    _claims_runs(tmp_path)
    shutil.copytree(tmp_path / "ppo-seed1", tmp_path / "ppo-seed1-copy")
    assert main(["claims", "--no-train", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"trustlens claims: error: runs {tmp_path / 'ppo-seed1'} and {tmp_path / 'ppo-seed1-copy'} are both rule "
        "ppo on seed 1: measured together, that seed would count twice; leave one of them out\n"
    )
    assert not (tmp_path / "claims.md").exists()


def test_claims_no_train_refuses_two_largest_sets_of_other_settings(tmp_path, capsys):
    from trustlens.cli import main

    _claims_runs(tmp_path, seeds=(0,))
    _claims_runs(tmp_path, seeds=(1,), steps=14)
    assert main(["claims", "--no-train", "--out", str(tmp_path)]) == 2
    preset = "not trained by `trustlens train`"
    assert capsys.readouterr().err == (
        f"trustlens claims: error: --out {tmp_path} holds equally large sets of runs with different settings: "
        f"dppo_binary_tv-seed0, ppo-seed0 ({preset}); dppo_binary_tv-seed1, ppo-seed1 ({preset}); move the runs "
        "to measure into a folder of their own\n"
    )


def test_claims_no_train_on_the_sample_measures_its_collapse_runs_one_seed_each(tmp_path, capsys):
    """The shipped sample: three runs of the sample preset on seed 1, and `learning` (the default
    preset on seed 0), which is left out rather than counted as a second dppo_binary_tv seed."""
    import shutil
    from pathlib import Path

    import polars as pl

    from trustlens.cli import main

    out = tmp_path / "sample"
    shutil.copytree(Path(__file__).resolve().parent.parent / "data" / "sample_run", out)
    assert main(["claims", "--no-train", "--out", str(out)]) == 0
    learning = (
        "learning (dppo_binary_tv, seed 0; preset `default` with keep_rate=0.03): eval_every=20, lr=3e-05, "
        "rollout_lag=0, rollout_precision=bf16, steps=160, tv_bound=None; the measured runs have eval_every=10, "
        "lr=6e-05, rollout_lag=16, rollout_precision=fp8, steps=250, tv_bound=0.1"
    )
    assert f"left out:\n  {learning}\n" in capsys.readouterr().out
    report = (out / "claims.md").read_text()
    assert f"3 runs in `{out}` (preset `sample`)" in report and f"\n- {learning}\n" in report
    table = pl.read_csv(out / "compare.csv")
    assert table["rule"].to_list() == ["dppo_binary_tv", "pg_is", "ppo"] and table["n"].to_list() == [1, 1, 1]
    dppo = table.row(0, named=True)
    assert dppo["block_rate_mean"] == pytest.approx(0.04144, abs=1e-5) and dppo["block_rate_se"] is None
    assert dppo["acc_final_mean"] == pytest.approx(0.396)


def test_claims_no_train_with_a_preset_measures_the_runs_of_those_settings(tmp_path, capsys):
    """--preset and training flags choose the set measured: on the sample, `learning` (the
    default preset with keep_rate=0.03) instead of the larger set of the sample preset; settings
    no run has are an error that names what the folder holds."""
    import shutil
    from pathlib import Path

    import polars as pl

    from trustlens.cli import main

    out = tmp_path / "sample"
    shutil.copytree(Path(__file__).resolve().parent.parent / "data" / "sample_run", out)
    assert main(["claims", "--no-train", "--preset", "default", "--keep-rate", "0.03", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(
        f"measuring 1 run in {out} (preset `default` with keep_rate=0.03), the set with the settings asked for\n"
    )
    assert "\n  ppo (ppo, seed 1; preset `sample`): " in printed
    assert pl.read_csv(out / "compare.csv")["rule"].to_list() == ["dppo_binary_tv"]
    assert main(["claims", "--no-train", "--preset", "collapse", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"trustlens claims: error: --out {out} holds no finished runs with the settings asked for (preset "
        "`collapse`); it holds "
    )
    assert "learning (preset `default` with keep_rate=0.03)" in err


def test_preset_of_names_the_nearest_preset_and_what_differs():
    from dataclasses import asdict
    from types import SimpleNamespace

    from trustlens.train.config import config_from_preset
    from trustlens.train.runsets import preset_of

    def run(config):
        return SimpleNamespace(manifest={"config": config})

    assert preset_of(run(asdict(config_from_preset("collapse", rule="ppo", seed=7)))) == "preset `collapse`"
    longer = asdict(config_from_preset("collapse", steps=300, lr=1e-4))
    assert preset_of(run(longer)) == "preset `collapse` with lr=0.0001, steps=300"
    assert preset_of(run({"source": "synthetic", "steps": 12})) == "not trained by `trustlens train`"
    assert preset_of(run({})) == "not trained by `trustlens train`"


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
    # runs after --to are read as its words: the error says where they go
    assert main(["export", "--to", "tensorboard", "tb", "runs/ppo"]) == 2
    assert capsys.readouterr().err == (
        "trustlens export: error: no RUN given: put the runs before --to (--to takes one or two words, got "
        "['tensorboard', 'tb', 'runs/ppo'])\n"
    )


def test_an_object_store_without_credentials_is_one_line_naming_what_to_set(tmp_path, monkeypatch, capsys):
    """botocore's NoCredentialsError is not an OSError: one line, not a traceback."""
    s3fs = pytest.importorskip("s3fs")
    from trustlens.cli import main

    s3fs.S3FileSystem.clear_instance_cache()  # fsspec caches filesystems with their credentials

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata lookup
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never reached
    monkeypatch.delenv("TRUSTLENS_DEBUG", raising=False)
    assert main(["export", "s3://bucket/runs/ppo", "--to", "tensorboard", str(tmp_path / "tb")]) == 2
    assert capsys.readouterr().err == (
        "trustlens export: error: object store: NoCredentialsError: Unable to locate credentials (set "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and AWS_ENDPOINT_URL for a server other than AWS)\n"
    )
