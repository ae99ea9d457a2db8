"""`trustlens train --keep-rules R1,R2` (TrainConfig.keep_rules, Keep(rules=...)): the rules'
blocked tokens are all kept at weight 1; the setting is in run.json's config, so `--reuse` keeps
a finished run only when its keep rules are the ones asked for."""

from dataclasses import replace

import polars as pl
import pytest

from trustlens import load_run
from trustlens.cli import main
from trustlens.train.config import config_from_preset
from trustlens.train.runsets import _finished_with

QUICK = ["--preset", "quick", "--checkpoint", "random", "--max-new-tokens", "6", "--quiet", "--steps", "2"]


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_keep_rules_keep_every_token_the_rules_block(capsys, tmp_path):
    code, _, err = run_cli(
        capsys, "train", *QUICK, "--keep-rate", "0.01", "--keep-rules", "rs_geo,ppo", "--out", str(tmp_path / "r")
    )
    assert code == 0, err
    run = load_run(tmp_path / "r")
    assert run.manifest["keep"]["rules"] == ["rs_geo", "ppo"]
    assert run.manifest["config"]["keep_rules"] == ["rs_geo", "ppo"]
    kept = run.tokens.select(pl.col("blocked_rs_geo").sum(), pl.col("blocked_ppo").sum()).collect().row(0)
    exact = run.aggregates.select(
        pl.sum_horizontal(pl.col("k_rs_geo_pos"), pl.col("k_rs_geo_neg")).sum(),
        pl.sum_horizontal(pl.col("k_ppo_pos"), pl.col("k_ppo_neg")).sum(),
    )
    assert kept == exact.collect().row(0)  # every blocked token is among the rows, not a sample of them
    blocked = run.tokens.filter(pl.col("blocked_rs_geo") | pl.col("blocked_ppo"))
    assert blocked.select((pl.col("weight") == 1).all()).collect().item()


@pytest.mark.parametrize(
    "rules, message",
    [("rs_ge", "argument --keep-rules: rule must be one of"), ("ppo,ppo", "listed twice")],
)
def test_bad_keep_rules_exit_2_with_usage(capsys, tmp_path, rules, message):
    with pytest.raises(SystemExit) as exit_:
        main(["train", *QUICK, "--keep-rate", "0.1", "--keep-rules", rules, "--out", str(tmp_path / "r")])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_keep_rules_without_a_keep_rate_exit_2(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", *QUICK, "--keep-rules", "rs_geo", "--out", str(tmp_path / "r"))
    assert code == 2 and "keep_rules ['rs_geo'] need a keep_rate" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_keep_rules_are_checked_in_the_config():
    with pytest.raises(ValueError, match=r"keep_rules: .*did you mean 'rs_geo'"):
        config_from_preset("quick", keep_rate=0.1, keep_rules=["rs_ge"])
    with pytest.raises(ValueError, match="keep_rules must be a list of rule names"):
        config_from_preset("quick", keep_rate=0.1, keep_rules="rs_geo")


def test_reuse_keeps_a_run_only_with_the_same_keep_rules(capsys, tmp_path):
    flags = [*QUICK, "--rules", "ppo", "--keep-rate", "0.01", "--out", str(tmp_path)]
    assert run_cli(capsys, "compare", *flags, "--keep-rules", "rs_geo")[0] == 0
    cfg = replace(config_from_preset("quick", **load_run(tmp_path / "ppo").manifest["config"]), keep_rules=["rs_geo"])
    assert _finished_with(tmp_path / "ppo", cfg)
    assert not _finished_with(tmp_path / "ppo", replace(cfg, keep_rules=[]))
    assert not _finished_with(tmp_path / "ppo", replace(cfg, keep_rules=["rs_geo", "gspo"]))
    code, out, _ = run_cli(capsys, "compare", *flags, "--keep-rules", "rs_geo", "--reuse")
    assert code == 0 and "keeping the finished run" in out
    code, out, err = run_cli(capsys, "compare", *flags, "--keep-rules", "gspo", "--reuse", "--overwrite")
    assert code == 0 and "keeping the finished run" not in out, err
    assert load_run(tmp_path / "ppo").manifest["keep"]["rules"] == ["gspo"]
