"""Bad settings of the built-in training run and its CLI (issue 32): refused naming the setting,
before any training starts."""

from __future__ import annotations

import math

import pytest

from trustlens.cli import main
from trustlens.train.config import TrainConfig

NAN, INF = math.nan, math.inf

CASES = [
    *[("temperature", v, ValueError) for v in (0, -1.0, INF, NAN)],
    *[(f, v, ValueError) for f in ("lr", "grad_clip", "clip_ratio_c") for v in (0, -1e-5, INF, NAN)],
    *[(f, v, ValueError) for f in ("logit_noise", "weight_decay") for v in (-0.1, NAN, INF)],
    *[("tv_bound", v, ValueError) for v in (0, 1, 1.5, NAN)],
    *[(f, 2.5, TypeError) for f in ("steps", "prompts_per_step", "minibatches", "epochs", "seed", "topk", "eval_size")],
    *[(f, 0, ValueError) for f in ("steps", "prompts_per_step", "epochs", "eval_every", "threads", "topk")],
    ("minibatches", 1000, ValueError),
    ("group_size", 1, ValueError),
    ("rule", "dppo_binary_tvv", KeyError),
    ("loss_agg_mode", "sum", ValueError),
    ("rollout_precision", "fp16", ValueError),
    ("keep_rate", 0, ValueError),
    ("partial_credit", 1.0, ValueError),
    ("rollout_lag", -1, ValueError),
    ("scale_advantages", "yes", TypeError),
    ("record", "no", TypeError),
    ("checkpoint", "", ValueError),
    ("checkpoint", "/nonexistent/warmstart", ValueError),
    ("mirror", 3, TypeError),
    *[("mirror", v, ValueError) for v in ("tensorbord", "tensorboard", "tensorboard:", "", "wandbb:proj")],
]


@pytest.mark.parametrize(("field", "value", "error"), CASES)
def test_train_config_names_the_setting(field, value, error):
    with pytest.raises(error, match=field if error is not KeyError else value):
        TrainConfig(**{field: value})


@pytest.mark.parametrize("port", ["99999", "0", "-1", "http", "8501.5"])
def test_demo_refuses_a_bad_port_before_training(capsys, tmp_path, port):
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--out", str(tmp_path / "r"), "--port", port])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --port: expected a TCP port" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("port", ["99999", "0", "-1", "http"])
def test_dashboard_refuses_a_bad_port_while_parsing(capsys, tmp_path, port):
    with pytest.raises(SystemExit) as exit_:
        main(["dashboard", str(tmp_path), "--port", port])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --port: expected a TCP port" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["train", "--mirror", "tensorbord"], "--mirror"),
        (["train", "--mirror", "tensorboard:"], "--mirror"),
        (["dashboard", "--host", ""], "--host"),
        (["report", "some_run", "-o", ""], "-o/--out"),
    ],
)
def test_flags_are_refused_while_parsing(capsys, argv, flag):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {flag}: must be" in err and "Traceback" not in err


def test_valid_mirror_settings():
    for mirror in ("wandb", "wandb:my-project", "tensorboard:tb"):
        assert TrainConfig(mirror=mirror).mirror == mirror
