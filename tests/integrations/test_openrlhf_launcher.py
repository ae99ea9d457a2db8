"""`python -m trustlens.integrations.openrlhf`'s handling of TRUSTLENS_DIR (no OpenRLHF or Ray
needed: Ray's init, trustlens' setup and OpenRLHF's train_ppo_ray are stand-ins that record what
they were given)."""

import os
import sys
import types

import pytest

from trustlens.integrations import openrlhf as hook
from trustlens.integrations.openrlhf import launch


def _launch(monkeypatch, run_dir: str) -> tuple[dict, list]:
    """Run the launcher with TRUSTLENS_DIR=run_dir; (Ray's runtime_env, train_ppo_ray's argv)."""
    inits: list[dict] = []
    argvs: list[list[str]] = []
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(init=lambda **kw: inits.append(kw)))
    monkeypatch.setattr(launch, "setup", lambda: None)
    monkeypatch.setattr(launch.runpy, "run_module", lambda name, run_name: argvs.append(list(sys.argv)))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setenv("TRUSTLENS_DIR", run_dir)
    hook.main(["--actor.model_name_or_path", "m"])
    return inits[0]["runtime_env"], argvs[0]


@pytest.mark.parametrize("url", ["s3://bucket/runs/orl", "gs://b/r", "file:///tmp/runs/orl"])
def test_launcher_passes_a_url_run_directory_unchanged(monkeypatch, url):
    env, argv = _launch(monkeypatch, url)
    assert env["env_vars"]["TRUSTLENS_DIR"] == url == os.environ["TRUSTLENS_DIR"]
    assert env["worker_process_setup_hook"] == "trustlens.integrations.openrlhf.setup"
    assert argv == ["train_ppo_ray", "--actor.model_name_or_path", "m"]


def test_launcher_makes_a_local_run_directory_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    env, _ = _launch(monkeypatch, "runs/orl")
    assert env["env_vars"]["TRUSTLENS_DIR"] == str(tmp_path / "runs" / "orl") == os.environ["TRUSTLENS_DIR"]


def test_launcher_needs_a_run_directory(monkeypatch):
    monkeypatch.delenv("TRUSTLENS_DIR", raising=False)
    with pytest.raises(SystemExit, match="set TRUSTLENS_DIR"):
        hook.main([])
