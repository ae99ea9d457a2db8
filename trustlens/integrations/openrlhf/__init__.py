"""Record an OpenRLHF (0.11) PPO/GRPO run with trustlens, without forking OpenRLHF.

    TRUSTLENS_DIR=runs/orl python -m trustlens.integrations.openrlhf <train_ppo_ray arguments>

starts Ray with `setup` as every Ray process's `worker_process_setup_hook` (and TRUSTLENS_DIR in
their environment), then runs `openrlhf.cli.train_ppo_ray`. With a Ray cluster you start
yourself, pass the same `runtime_env={"worker_process_setup_hook":
"trustlens.integrations.openrlhf.setup", "env_vars": {"TRUSTLENS_DIR": ...}}` to `ray.init`.

What is recorded, per micro-batch of `ActorPPOTrainer.training_step` (at its `PolicyLoss` call,
training passes only), per action token (`action_mask`):

    token_ids     the response part of `experience.sequences`
    pi_logp       the actor's log-probs of the loss
    old_logp      `experience.action_log_probs`, the π_old OpenRLHF clips against
    mu_logp       `experience.rollout_log_probs` when vLLM returned them, else null
    advantages    `experience.advantages` (B, A)

Entropy is not recorded (OpenRLHF computes it only with an entropy loss). Every rule but the
top-K ones is evaluated counterfactually; OpenRLHF's `ppo` loss clips π/π_old, which is
trustlens' `minirl` (its dual clip and train/rollout IS correction are named in run.json, no rule
blocks the same tokens); its `gspo` loss has no matching rule.

Live alerts (trustlens.live): the driver's recorder raises them from what it holds (samples and
OpenRLHF's logged numbers) and adds the alerts so far to the numbers OpenRLHF logs as
`trustlens/alert/...` (its W&B and TensorBoard loggers get them); how to stop on them:
docs/attach.md.

The driver (rank 0) records each step's samples (prompt and response text, reward, mean
advantage, length, from the experience batches) and OpenRLHF's logged numbers as
`openrlhf/<name>`, and marks the run finished, or failed with the error, when `PPOTrainer.fit`
returns. The actor of data-parallel rank r writes tokens as rank r + 1.

Steps: the step OpenRLHF's `fit` logs. `fit` calls `train_step(samples, global_step)` and then
`save_logs_and_checkpoints(global_step + 1)`, so the samples of that call and the tokens trained
on them are recorded at global_step + 1, as the metrics and checkpoint (`global_step<N>`) are, and
a run resumed from a checkpoint goes on from there. The driver sends the step to the actors with
the experiences (`info["trustlens_step"]`), with each sample's id (`info["trustlens_sample"]`,
numbered over all the step's experiences: `trustlens.integrations._ray_hooks`); the actor takes
both out of `info` (OpenRLHF would log them as metrics) and records its rows under them. An
actor whose experiences came without them counts its `ppo_train` calls from 1 and uses content
ids. `update`: the optimizer step within the step.

PPOTrainer is a Ray actor class: `setup` patches the copy of its methods Ray ships (the driver
module says how); the process that creates the trainer (the launcher, or your driver script)
must have called `setup` first.

Every name is importable from here; the code is in this package's `compat` (the OpenRLHF
releases supported), `rules` (`openrlhf_active_rule`), `sampling` (run.json's `sampling`),
`state` (what the hooks of one process share), `workers` (the actors' hooks), `driver` (the
driver's hooks), `patch` (`setup`) and `launch` (`python -m trustlens.integrations.openrlhf`).
This package imports without OpenRLHF; `setup` needs it.
"""

from __future__ import annotations

from trustlens.integrations.openrlhf.compat import (
    MAX_TESTED_OPENRLHF,
    MIN_OPENRLHF,
    UnsupportedOpenRLHFVersion,
)
from trustlens.integrations.openrlhf.launch import main
from trustlens.integrations.openrlhf.patch import setup
from trustlens.integrations.openrlhf.rules import openrlhf_active_rule
from trustlens.integrations.openrlhf.sampling import openrlhf_sampling

__all__ = [
    "MAX_TESTED_OPENRLHF",
    "MIN_OPENRLHF",
    "UnsupportedOpenRLHFVersion",
    "main",
    "openrlhf_active_rule",
    "openrlhf_sampling",
    "setup",
]
