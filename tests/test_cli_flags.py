"""The command line answers mistakes while the flags are parsed: a typo of a choice names the
closest choice, a subcommand's unknown flag shows that subcommand's usage, a port in use is found
before any work, and a missing optional integration names its extra."""

import socket
import sys

import pytest

from trustlens.cli import main


def _refused(capsys, argv: list[str]) -> str:
    """stderr of `trustlens ARGV`, which must exit with status 2 while parsing."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "flag", "typo", "meant"),
    [
        (["train", "--engine", "shiftd"], "--engine", "shiftd", "shifted"),
        (["train", "--preset", "quik"], "--preset", "quik", "quick"),
        (["demo", "--preset", "colapse"], "--preset", "colapse", "collapse"),
        (["train", "--rule", "dppo_binray_tv"], "--rule", "dppo_binray_tv", "dppo_binary_tv"),
        (["demo", "--rule", "pp0"], "--rule", "pp0", "ppo"),
        (["compare", "--rules", "ppo,pg_si"], "--rules", "pg_si", "pg_is"),
        (["claims", "--rules", "cispoo"], "--rules", "cispoo", "cispo"),
        (["train", "--rollout-precision", "fp9"], "--rollout-precision", "fp9", "fp8"),
        (["train", "--loss-agg-mode", "token_mean"], "--loss-agg-mode", "token_mean", "token-mean"),
        (["export", "RUN", "--to", "tensorbord", "logs"], "--to", "tensorbord", "tensorboard"),
        (["trian"], "COMMAND", "trian", "train"),
    ],
)
def test_a_typo_of_a_choice_names_the_closest_one(capsys, argv, flag, typo, meant):
    err = _refused(capsys, argv)
    assert f"argument {flag}: " in err
    assert f"got {typo!r} (did you mean {meant!r}?)" in err
    assert len(err.strip().splitlines()[-1]) < 400  # one line, not a traceback


def test_choice_flags_take_every_valid_value():
    from trustlens.cli import build_parser
    from trustlens.rules import RULES
    from trustlens.train.engine_defects import ENGINE_DEFECTS

    parser = build_parser("train")
    engine_help = next(a.help for a in parser.commands["train"]._actions if "--engine" in a.option_strings)
    for engine in ENGINE_DEFECTS:
        assert parser.parse_args(["train", "--engine", engine]).engine == engine
        assert engine in engine_help  # the help lists every defect, as the registry does
    for rule in RULES:
        assert parser.parse_args(["train", "--rule", rule]).rule == rule
    args = parser.parse_args(["train", "--rollout-precision", "fp8", "--loss-agg-mode", "seq-mean-token-sum-norm"])
    assert (args.rollout_precision, args.loss_agg_mode) == ("fp8", "seq-mean-token-sum-norm")
    assert build_parser("compare").parse_args(["compare", "--rules", "ppo, pg_is"]).rules == ["ppo", "pg_is"]


@pytest.mark.parametrize(
    ("argv", "meant"), [(["train", "--seeed", "3"], "--seed"), (["dashboard", "--prot"], "--port")]
)
def test_an_unknown_flag_shows_its_subcommands_usage(capsys, argv, meant):
    err = _refused(capsys, argv)
    command, *given = argv
    assert err.startswith(f"usage: trustlens {command} ")
    assert f"trustlens {command}: error: unrecognized arguments: {' '.join(given)} (did you mean {meant!r}?)" in err


def test_an_unknown_flag_far_from_every_flag_suggests_nothing(capsys):
    err = _refused(capsys, ["train", "--bogus"])
    assert err.strip().endswith("trustlens train: error: unrecognized arguments: --bogus")


def test_demo_help_shows_the_seed_the_demo_uses(capsys):
    from trustlens.train.sample import DEMO_SEED

    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    demo = " ".join(capsys.readouterr().out.split())
    assert f"seed of the problems, the sampling and the minibatch order [{DEMO_SEED}]" in demo
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "minibatch order [0]" in " ".join(capsys.readouterr().out.split())


def _rule_groups(help_text: str) -> dict[str, dict[str, str]]:
    """{level: {rule: description}} of the --rule entry of a command's --help (its lines under
    "<level> rules:", each "  name: description" with its wrapped continuation)."""
    options = help_text[help_text.index("\n  --rule RULE") :]
    lines = options[: options.index("\n  --out OUT")].splitlines()
    groups: dict[str, dict[str, str]] = {}
    rule = ""
    for line in (line.strip() for line in lines[2:]):
        if line.endswith(" rules:"):
            level, groups[line.removesuffix(" rules:")] = line.removesuffix(" rules:"), {}
        elif groups and ": " in line and line.split(": ", 1)[0].isidentifier():
            rule, text = line.split(": ", 1)
            groups[level][rule] = text
        elif groups:
            groups[level][rule] += " " + line
    return groups


@pytest.mark.parametrize("command", ["train", "demo"])
def test_rule_help_lists_the_registry_by_level(capsys, command):
    """--rule's help names every rule of the registry under its level, with its description."""
    from trustlens.rules import RULES

    with pytest.raises(SystemExit):
        main([command, "--help"])
    groups = _rule_groups(capsys.readouterr().out)
    assert list(groups) == ["token", "sequence", "batch"]
    for level, rules in groups.items():
        assert list(rules) == [name for name, rule in RULES.items() if rule.level == level]
        for name, text in rules.items():
            assert text == " ".join(RULES[name].description.split())


@pytest.fixture
def busy_port():
    """A port something listens on, on 127.0.0.1."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.listen()
        yield server.getsockname()[1]


def _no_training(*args, **kwargs):
    raise AssertionError("trained although the dashboard's port is in use")


def test_demo_refuses_a_port_in_use_before_training(capsys, monkeypatch, busy_port, tmp_path):
    import trustlens.train.sample

    monkeypatch.setattr(trustlens.train.sample, "run_one", _no_training)
    assert main(["demo", "--port", str(busy_port), "--out", str(tmp_path / "demo"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"trustlens demo: error: port {busy_port} on 127.0.0.1 is already in use; pass --port ")
    free = int(err.split("--port ")[1].split(",")[0])
    assert free > busy_port
    with socket.create_server(("127.0.0.1", free)):  # the port it names is free
        pass
    assert len(err.splitlines()) == 1


def test_demo_without_dashboard_ignores_the_port(monkeypatch, busy_port, tmp_path):
    import trustlens.train.sample

    monkeypatch.setattr(trustlens.train.sample, "run_one", lambda *a, **k: None)
    monkeypatch.setattr(trustlens.train.sample, "finish", lambda: None)
    out = tmp_path / "demo"
    assert main(["demo", "--port", str(busy_port), "--out", str(out), "--no-dashboard", "--quiet"]) == 0


def test_dashboard_refuses_a_port_in_use_before_starting(capsys, monkeypatch, busy_port):
    import subprocess

    monkeypatch.setattr(subprocess, "Popen", _no_training)
    assert main(["dashboard", "--port", str(busy_port)]) == 2
    err = capsys.readouterr().err
    assert f"port {busy_port} on 127.0.0.1 is already in use; pass --port " in err
    assert "serving" not in err


def test_a_free_port_passes(busy_port):
    from trustlens.dashboard import check_port_free

    with socket.create_server(("127.0.0.1", 0)) as probe:
        free = probe.getsockname()[1]
    check_port_free(free)
    with pytest.raises(OSError, match=f"port {busy_port} on 127.0.0.1 is already in use"):
        check_port_free(busy_port)


@pytest.mark.parametrize(("module", "package", "extra"), [("verl", "verl", "verl"), ("trl", "trl", "trl")])
def test_a_missing_integration_names_its_extra(monkeypatch, module, package, extra):
    monkeypatch.setitem(sys.modules, package, None)  # as if not installed
    for name in [m for m in sys.modules if m.startswith(f"trustlens.integrations.{module}")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, f"trustlens.integrations._{module}_compat", raising=False)
    with pytest.raises(ImportError, match=rf'pip install "trustlens\[{extra}\]"') as err:
        # verl's package imports without verl (its config readers need none); its hook does not
        __import__(f"trustlens.integrations.{module}")
        sys.modules[f"trustlens.integrations.{module}"].setup()
    assert err.value.name == package


def test_training_reports_one_speed_figure(capsys, monkeypatch, tmp_path):
    """run_one's summary is the one s/step figure (the mean training step); the bar shows no rate."""
    import trustlens.train.trainer
    from trustlens.train.config import config_from_preset
    from trustlens.train.progress import progress_bar
    from trustlens.train.runner import run_one
    from trustlens.train.trainer import TrainResult

    result = TrainResult(tmp_path / "run", eval_accuracy={0: 0.25, 3: 0.5}, step_times=[1.0, 2.0, 6.0])
    monkeypatch.setattr(trustlens.train.trainer, "train", lambda *a, **k: result)
    run_one(config_from_preset("quick"), tmp_path / "run", overwrite=False, quiet=True)
    out = capsys.readouterr().out
    assert out.count("s/step") == 1
    assert "held-out accuracy 0.250 → 0.500 (steps 0 → 3), 3.00 s/step (training; setup and evaluations" in out
    bar = progress_bar(3, True)
    bar.update(1)
    shown = str(bar)
    bar.close()
    assert "1/3" in shown and "s/step" not in shown and "step/s" not in shown


def test_a_host_that_does_not_resolve_is_named(capsys):
    assert main(["dashboard", "--host", "no-such-host.invalid"]) == 2
    assert "trustlens dashboard: error: --host 'no-such-host.invalid' names no address" in capsys.readouterr().err
