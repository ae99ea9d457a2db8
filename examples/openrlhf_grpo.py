"""OpenRLHF (0.11) GRPO with trustlens attached: OpenRLHF's own trainer, recorded by
`trustlens.integrations.openrlhf`, then `trustlens dashboard`. Needs a GPU machine with OpenRLHF,
vLLM and DeepSpeed installed as OpenRLHF's README says (it does not install on a CPU machine;
what was tested on one is in docs/attach.md).

    python examples/openrlhf_grpo.py --out runs/orl --model Qwen/Qwen2.5-0.5B-Instruct \\
        --prompts OpenRLHF/prompt-collection-v0.1 --reward-url http://127.0.0.1:5000/get_reward

which runs, with TRUSTLENS_DIR=--out:

    python -m trustlens.integrations.openrlhf <OpenRLHF's train_ppo_ray arguments below>

The launcher starts Ray with trustlens' setup hook in every Ray process, then runs
`openrlhf.cli.train_ppo_ray` unchanged. `--dry-run` prints the command instead.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path


def openrlhf_args(args: argparse.Namespace) -> list[str]:
    """train_ppo_ray arguments for a small single-node GRPO run (group-normalised advantages)."""
    gpus = str(args.gpus)
    return [
        *("--actor.model_name_or_path", args.model, "--data.prompt_dataset", args.prompts),
        *("--data.input_key", args.input_key, "--reward.remote_url", args.reward_url),
        *("--actor.num_nodes", "1", "--actor.num_gpus_per_node", gpus, "--ref.num_gpus_per_node", gpus),
        *("--vllm.num_engines", gpus, "--algo.advantage.estimator", "group_norm"),
        *("--rollout.n_samples_per_prompt", "4", "--rollout.batch_size", "32", "--train.batch_size", "64"),
        *("--train.micro_batch_size", "4", "--train.num_episodes", "1", "--actor.policy_loss_type", "ppo"),
        *("--ckpt.output_dir", str(Path(args.out) / "checkpoint")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="run directory to create (TRUSTLENS_DIR)")
    parser.add_argument("--model", required=True, help="policy model: a local path or a hub name")
    parser.add_argument("--prompts", required=True, help="prompt dataset: a local path or a hub name")
    parser.add_argument("--input-key", default="context_messages", help="the dataset's prompt field")
    parser.add_argument("--reward-url", required=True, help="a remote reward function (OpenRLHF's --reward.remote_url)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs on this node")
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    args = parser.parse_args()
    command = [sys.executable, "-m", "trustlens.integrations.openrlhf", *openrlhf_args(args)]
    run_dir = str(Path(args.out).resolve())
    if args.dry_run:
        print(f"TRUSTLENS_DIR={shlex.quote(run_dir)} {shlex.join(command)}")
        return
    subprocess.run(command, check=True, env={**os.environ, "TRUSTLENS_DIR": run_dir})
    print(f"recorded {run_dir}; open it with:  trustlens dashboard {Path(run_dir).parent}")


if __name__ == "__main__":
    main()
