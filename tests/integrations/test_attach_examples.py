"""The attach examples' command lines (no verl or OpenRLHF needed): what they would run."""

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_openrlhf_example_runs_openrlhf_through_the_launcher(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "openrlhf_grpo.py"),
            "--out",
            str(tmp_path / "orl"),
            "--model",
            "m",
            "--prompts",
            "p",
            "--reward-url",
            "http://127.0.0.1:5000/get_reward",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith(f"TRUSTLENS_DIR={tmp_path / 'orl'} ")
    assert "-m trustlens.integrations.openrlhf --actor.model_name_or_path m --data.prompt_dataset p" in out
    assert "--algo.advantage.estimator group_norm" in out


def test_verl_example_says_how_to_attach_on_a_gpu_machine():
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "verl_grpo.py"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "actor_rollout_ref.model.external_lib=trustlens.integrations.verl" in out
    assert "worker_process_setup_hook=trustlens.integrations.verl.setup" in out
