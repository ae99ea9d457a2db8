"""verl's own trainer with trustlens attached by configuration alone, on a CPU: two GRPO steps of
`python -m verl.trainer.main_ppo` (verl 0.9) on 2 Ray workers, recorded, checked, then
`trustlens dashboard`.

    python examples/verl_grpo.py --out runs/verl_cpu

On a GPU machine a verl run is recorded by configuration alone (docs/attach.md):

    export TRUSTLENS_DIR=$PWD/runs/verl_grpo
    python -m verl.trainer.main_ppo ... \\
        actor_rollout_ref.model.external_lib=trustlens.integrations.verl \\
        +ray_kwargs.ray_init.runtime_env.env_vars.TRUSTLENS_DIR=$TRUSTLENS_DIR \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=trustlens.integrations.verl.setup

This script runs that `main_ppo` (the first two trustlens lines; verl 0.9 imports `external_lib`
in its trainer process too, so the setup hook is not needed) with verl's default trainer (v1,
engine workers, FSDP2, TransferQueue, agent loop, GRPO advantages, PPO loss, weight sync). What
is not verl's is test-only, in examples/verl_cpu (verl imports its `plugin` in every process
through `VERL_USE_EXTERNAL_MODULES`):

    platform  a CPU device platform (gloo); Ray counts 2 fake GPUs as the workers' slots
    rollout   `rollout.name=hf_cpu`: HuggingFace `generate` on the CPU in place of vLLM/SGLang,
              returning the sampled tokens' log-probs (μ); weights are copied to it every step
    data      a 2-layer Llama with random weights, a word-level tokenizer, 16 prompts
              "repeat the digit d"; reward: the share of response words that are d

It writes OUT/model, OUT/train.parquet, OUT/main_ppo.log and the recorded run OUT/run, checks the
run against what verl trained, and prints the dashboard command.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
PROMPTS, N, STEPS, WORKERS = 4, 4, 2, 2  # prompts per step, responses per prompt, steps, Ray workers
MINI = 2  # prompts per mini-batch: 2 updates per step, N * MINI / WORKERS samples per update and rank


def main_ppo_args(out: Path) -> list[str]:
    """`main_ppo`'s Hydra overrides: the trustlens lines, then the tiny CPU run."""
    run_dir = out / "run"
    return [
        "actor_rollout_ref.model.external_lib=trustlens.integrations.verl",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.TRUSTLENS_DIR={run_dir}",
        "algorithm.adv_estimator=grpo",
        f"data.train_files={out / 'train.parquet'}",
        f"data.val_files={out / 'train.parquet'}",
        f"data.train_batch_size={PROMPTS}",
        "data.max_prompt_length=16",
        "data.max_response_length=8",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={out / 'model'}",
        "actor_rollout_ref.model.use_remove_padding=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.strategy=fsdp2",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.calculate_entropy=True",
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
        "actor_rollout_ref.rollout.name=hf_cpu",
        f"actor_rollout_ref.rollout.n={N}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        f"reward.custom_reward_function.path={EXAMPLES / 'verl_cpu' / 'reward.py'}",
        f"trainer.n_gpus_per_node={WORKERS}",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={STEPS}",
        "trainer.logger=[console]",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        f"+ray_kwargs.ray_init.num_gpus={WORKERS}",  # fake GPUs: the workers' slots
        "+ray_kwargs.ray_init.num_cpus=8",
        "+ray_kwargs.ray_init.include_dashboard=False",
    ]


def environment(run_dir: Path) -> dict[str, str]:
    """The environment of `main_ppo` (Ray's workers inherit it): verl_cpu plugged in and selected."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # a cluster of its own, on this machine only: with this
    # variable at 0, Ray on Linux takes 127.0.0.1 as the node address and its servers listen on
    # the loopback interface alone (by default they listen on every interface)
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(EXAMPLES), env.get("PYTHONPATH")) if p),
        VERL_USE_EXTERNAL_MODULES="verl_cpu.plugin",
        VERL_PLATFORM="trustlens_cpu",
        VERL_ENGINE_DEVICE="cuda",  # verl's FSDP engine is registered for "cuda" only
        TRUSTLENS_DIR=str(run_dir),
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def train(out: Path, timeout: float = 900) -> Path:
    """Build the model and data in `out`, run `main_ppo` on them; returns the recorded run."""
    sys.path.insert(0, str(EXAMPLES))
    from verl_cpu import data

    data.build(out, prompts=4 * PROMPTS)
    run_dir = out / "run"
    with open(out / "main_ppo.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "verl.trainer.main_ppo", *main_ppo_args(out)],
            cwd=out,
            env=environment(run_dir),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)  # main_ppo stops the Ray cluster it started on exit
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
    if code != 0:
        raise SystemExit(f"main_ppo failed (exit {code}); see {out / 'main_ppo.log'}")
    return run_dir


def check(run_dir: Path) -> dict[str, int]:
    """The recorded run against what verl trained; raises AssertionError naming what is wrong.
    Returns token rows and samples per step."""
    import polars as pl

    from trustlens import load_run

    run = load_run(run_dir)
    tokens, samples, metrics = run.tokens.collect(), run.samples.collect(), run.metrics.collect()
    per_update = N * MINI // WORKERS
    key = ["step", "update", "rank", "sample", "pos"]
    failures = [
        msg
        for ok, msg in [
            (run.manifest["status"] == "finished", f"status {run.manifest['status']!r}"),
            (sorted(tokens["rank"].unique()) == list(range(1, WORKERS + 1)), "a worker rank is missing"),
            (tokens.select(key).is_duplicated().sum() == 0, "duplicated token rows"),
            (tokens["mu_logp"].null_count() == 0, "μ (rollout log-probs) missing"),
            (tokens["entropy"].null_count() == 0, "entropy missing"),
            (sorted(samples["step"].unique()) == list(range(1, STEPS + 1)), "steps of the samples"),
            (len(samples) == STEPS * PROMPTS * N, f"{len(samples)} samples"),
        ]
        if not ok
    ]
    # each sample trained once per step, on one rank in one update, N * MINI / WORKERS per update
    trained = tokens.group_by("step", "sample").agg(pl.len(), pl.col("update", "rank").n_unique())
    joined = trained.join(samples, on=["step", "sample"], how="left")
    if joined["length"].null_count() or (joined["len"] != joined["length"]).any():
        failures.append("token rows differ from the samples' response lengths")
    if (joined["update"] != 1).any() or (joined["rank"] != 1).any():
        failures.append("a sample trained in more than one update or rank")
    shares = tokens.group_by("step", "update", "rank").agg(pl.col("sample").n_unique())
    if (shares["sample"] != per_update).any() or len(shares) != STEPS * 2 * WORKERS:
        failures.append(f"not {per_update} samples per step, update and rank")
    # verl's own count: response_length/mean over the step's samples
    lengths = metrics.filter(pl.col("name") == "verl/response_length/mean").sort("step")["value"] * PROMPTS * N
    rows = tokens.group_by("step").len().sort("step")["len"]
    if lengths.round().cast(pl.Int64).to_list() != rows.to_list():
        failures.append(f"token rows per step {rows.to_list()}, verl trained {lengths.to_list()}")
    if failures:
        raise AssertionError("; ".join(failures))
    return {"token_rows": len(tokens), "samples": len(samples)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory to create (model, data, log, run)")
    out = Path(parser.parse_args().out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    run_dir = train(out)
    counts = check(run_dir)
    print(f"main_ppo: {STEPS} steps in {time.monotonic() - start:.0f} s; recorded {counts} in {run_dir}")
    print(f"open it with:  trustlens dashboard {run_dir}")


if __name__ == "__main__":
    main()
