from dataclasses import asdict

import polars as pl
import pytest

import trustlens
from trustlens.cli import main
from trustlens.train.config import PRESETS, config_from_preset

# a few-second run of the whole pipeline from a random model (no warm start needed)
QUICK = ["--preset", "quick", "--checkpoint", "random", "--max-new-tokens", "6", "--quiet"]


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--rule",
        "--steps",
        "--out",
        "--seed",
        "--preset",
        "--checkpoint",
        "--lr",
        "--minibatches",
        "--group-size",
        "--rollout-precision",
        "--logit-noise",
        "--low",
        "--high",
    ):
        assert flag in text
    assert "dppo_binary_tv" in text and "offpolicy" in text


@pytest.mark.parametrize(
    ("command", "preset"),
    [
        ("train", "(listed at the end) [default]"),
        ("compare", "(listed at the end) [default]"),
        ("claims", "(listed at the end); with --no-train, it and the flags choose the runs measured [collapse]"),
    ],
)
def test_help_names_the_preset_each_command_uses(capsys, command, preset):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert preset in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--steps", "many"], "invalid int value"),
        (["train", "--preset", "huge"], "argument --preset: must be one of default, quick,"),
        # choices are checked while the flags are parsed, before any work, a typo named
        (["train", "--rule", "nope"], "argument --rule: must be one of ppo,"),
        (["train", "--rule", "dppo_binary"], "got 'dppo_binary' (did you mean 'dppo_binary_tv'?)"),
        (
            ["train", "--rollout-precision", "fp16"],
            "argument --rollout-precision: must be one of bf16, fp32, fp32_exact, fp8",
        ),
        (["train", "--loss-agg-mode", "sum"], "argument --loss-agg-mode: must be one of token-mean,"),
        (["compare", "--rules", "ppo,ppo"], "listed twice"),
        (["compare", "--seeds", "1,x"], "comma-separated integers"),
    ],
)
def test_bad_arguments_exit_2_with_usage(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "0"], "steps must be ≥ 1"),
        (["--group-size", "1"], "group_size must be ≥ 2"),
        (["--rule", "pg_is", "--high", "0.3"], "has no high threshold"),
        (["--temperature", "0"], "temperature must be a finite number > 0"),
        (["--temperature", "inf"], "temperature must be a finite number > 0"),
        (["--logit-noise", "nan"], "logit_noise must be a finite number"),
        (["--minibatches", "1000"], "minibatches must be ≤ the samples of a step"),
    ],
)
def test_bad_settings_exit_2_without_traceback(capsys, tmp_path, argv, message):
    code, _, err = run_cli(capsys, "train", *QUICK, "--out", str(tmp_path / "r"), *argv)
    assert code == 2
    assert not (tmp_path / "r").exists()
    assert message in err and "Traceback" not in err


def test_compare_rejects_an_unknown_rule_before_training(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "--rules", "ppo,bogus", *QUICK, "--out", str(tmp_path)])
    assert exit_.value.code == 2 and "argument --rules: rule must be one of ppo," in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_missing_checkpoint(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", "--checkpoint", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r"))
    assert code == 2
    assert "nowhere" in err and "missing" in err and "Traceback" not in err


def test_corrupt_checkpoint(capsys, tmp_path):
    from trustlens.train.model import ModelConfig, build_model, build_tokenizer, save_checkpoint

    ck = save_checkpoint(
        build_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)),
        build_tokenizer(),
        tmp_path / "ck",
    )
    (ck / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    code, _, err = run_cli(capsys, "train", "--checkpoint", str(ck), "--out", str(tmp_path / "r"))
    assert code == 2
    assert "unreadable" in err and "Traceback" not in err


def test_out_that_is_not_a_run_is_never_replaced(capsys, tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    code, _, err = run_cli(capsys, "train", *QUICK, "--out", str(tmp_path))
    assert code == 2 and "already exists" in err
    code, _, err = run_cli(capsys, "train", *QUICK, "--out", str(tmp_path), "--overwrite")
    assert code == 2 and "not a trustlens run" in err
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_compare_trains_each_rule_into_its_own_run(capsys, tmp_path):
    code, _, _ = run_cli(capsys, "compare", "--rules", "ppo,pg_is", "--steps", "2", *QUICK, "--out", str(tmp_path))
    assert code == 0
    runs = {r.manifest["active_rule"]: r for r in (trustlens.load_run(tmp_path / n) for n in ("ppo", "pg_is"))}
    assert set(runs) == {"ppo", "pg_is"}
    configs = [{k: v for k, v in r.manifest["config"].items() if k != "rule"} for r in runs.values()]
    assert configs[0] == configs[1]  # same seed and settings
    # same seed, same warm start: the first rollout batch is the same under both rules
    first = [
        r.samples.filter(pl.col("step") == 0).sort("sample").collect()["response"].to_list() for r in runs.values()
    ]
    assert first[0] == first[1]
    # a second run into the same place needs --overwrite
    assert run_cli(capsys, "compare", "--rules", "ppo", "--steps", "1", *QUICK, "--out", str(tmp_path))[0] == 2
    assert (
        run_cli(capsys, "compare", "--rules", "ppo", "--steps", "1", *QUICK, "--out", str(tmp_path), "--overwrite")[0]
        == 0
    )


def test_demo_without_dashboard_prints_how_to_inspect(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "demo", *QUICK, "--out", str(tmp_path / "demo"), "--no-dashboard")
    assert code == 0
    assert "load_run" in out and str(tmp_path / "demo") in out
    assert trustlens.load_run(tmp_path / "demo").manifest["status"] == "finished"


def test_demo_replaces_its_own_earlier_run(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        code, out, _ = run_cli(capsys, "demo", *QUICK, "--steps", "1", "--no-dashboard")
        assert code == 0 and "runs/demo" in out
    assert trustlens.load_run(tmp_path / "runs" / "demo").manifest["status"] == "finished"


def test_compare_with_two_jobs_trains_the_same_runs_as_one_job(capsys, tmp_path):
    """--jobs 2 trains two runs at a time, each in a process of its own: the runs are the ones
    one job trains (same seed and settings, so the same first rollout batch). Three runs: the
    third starts once one of the first two is done."""
    args = ["--rules", "pg_is", "--seeds", "0,1,2", "--steps", "2", *QUICK]
    assert run_cli(capsys, "compare", *args, "--jobs", "2", "--out", str(tmp_path / "two"))[0] == 0
    assert (
        run_cli(
            capsys,
            "compare",
            "--rules",
            "pg_is",
            "--seeds",
            "1",
            "--steps",
            "2",
            *QUICK,
            "--out",
            str(tmp_path / "one"),
        )[0]
        == 0
    )
    names = sorted(p.name for p in (tmp_path / "two").iterdir() if p.is_dir())
    assert names == ["pg_is-seed0", "pg_is-seed1", "pg_is-seed2"]
    manifests = [trustlens.load_run(tmp_path / "two" / n).manifest for n in names]
    assert [(m["status"], m["config"]["seed"]) for m in manifests] == [("finished", s) for s in (0, 1, 2)]
    first = [
        trustlens.load_run(p).samples.filter(pl.col("step") == 0).sort("sample").collect()["response"].to_list()
        for p in (tmp_path / "two" / "pg_is-seed1", tmp_path / "one" / "pg_is")
    ]
    assert first[0] == first[1]
    code, _, err = run_cli(capsys, "compare", *args, "--jobs", "0", "--out", str(tmp_path / "bad"))
    assert code == 2 and "jobs must be an integer ≥ 1" in err


def test_make_sample_trains_the_rules_under_the_sample_preset_and_a_learning_run(capsys, tmp_path):
    tiny = ["--steps", "2", "--prompts-per-step", "4", "--group-size", "4", "--minibatches", "2"]
    tiny += ["--eval-every", "2", "--eval-size", "16", "--checkpoint", "random", "--max-new-tokens", "6", "--quiet"]
    code, out, _ = run_cli(capsys, "make-sample", "--rules", "ppo,pg_is", *tiny, "--out", str(tmp_path))
    assert code == 0 and f"sample runs (ppo, pg_is, learning) written to {tmp_path}" in out
    configs = {n: trustlens.load_run(tmp_path / n).manifest["config"] for n in ("ppo", "pg_is", "learning")}
    given = dict(steps=2, prompts_per_step=4, group_size=4, minibatches=2, eval_every=2, eval_size=16)
    for name in ("ppo", "pg_is"):
        # the sample preset (the collapse preset on seed 1, sampled recording) under the flags given
        assert configs[name] == {**configs[name], **PRESETS["sample"], **given, "rule": name}
        assert (configs[name]["rollout_lag"], configs[name]["seed"], configs[name]["keep_rate"]) == (16, 1, 0.03)
    # the learning run: the default preset's DPPO run, recorded like the others
    default = asdict(config_from_preset("default", **given, checkpoint="random", max_new_tokens=6))
    assert configs["learning"] == {**default, "keep_rate": 0.03}
    assert all(trustlens.load_run(tmp_path / n).sampled for n in configs)


def test_demo_trains_a_seed_the_shipped_sample_does_not_have(capsys, tmp_path):
    from trustlens.train.sample import DEMO_SEED, default_sample_dir

    shipped = trustlens.load_run(default_sample_dir() / "learning").manifest["config"]["seed"]
    code, _, _ = run_cli(capsys, "demo", *QUICK, "--steps", "1", "--out", str(tmp_path / "d"), "--no-dashboard")
    assert code == 0 and trustlens.load_run(tmp_path / "d").manifest["config"]["seed"] == DEMO_SEED != shipped
    code, _, _ = run_cli(
        capsys, "demo", *QUICK, "--steps", "1", "--seed", "7", "--out", str(tmp_path / "e"), "--no-dashboard"
    )
    assert trustlens.load_run(tmp_path / "e").manifest["config"]["seed"] == 7  # a given seed wins


def test_demo_view_puts_the_run_beside_the_collapse_and_a_stable_dppo_run():
    from trustlens.train.sample import demo_view

    assert demo_view("demo", 8501) == (
        "http://127.0.0.1:8501/compare?run=demo&compare=demo&compare=sample_run%2Fpg_is"
        "&compare=sample_run%2Fdppo_binary_tv"
    )
