"""Record a verl PPO/GRPO run with trustlens by configuration alone, without forking verl.

    TRUSTLENS_DIR=runs/verl python -m verl.trainer.main_ppo ... \\
        actor_rollout_ref.model.external_lib=trustlens.integrations.verl \\
        +ray_kwargs.ray_init.runtime_env.env_vars.TRUSTLENS_DIR=runs/verl \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=trustlens.integrations.verl.setup

verl imports `external_lib` in every training worker (verl 0.9 in its driver, the TaskRunner,
too); Ray's `worker_process_setup_hook` runs `setup` in every Ray process, the driver included.
Importing this module (or calling `setup`) patches verl in that process, once; with TRUSTLENS_DIR
unset nothing is recorded.

Where the tensors meet (one hook per micro-batch of the policy loss, training passes only: passes
without gradient, such as verl's log-prob recomputation, record nothing):

    verl 0.8-0.9 (engine workers)  verl.workers.utils.losses.ppo_loss
    verl 0.7 (legacy FSDP workers) DataParallelPPOActor._forward_micro_batch inside update_policy

What is recorded, per response token verl trains on (response_mask):

    token_ids     `responses`
    pi_logp       the loss's own log π (verl's forward at its rollout temperature)
    old_logp      `old_log_probs`, the π_old verl clips against (verl 0.7 on-policy: π itself,
                  as verl uses it)
    mu_logp       `rollout_log_probs` when the rollout engine returned them, else null (the run's
                  μ-anchored rules are then evaluated on π_old, and run.json says "anchor": "old")
    advantages    `advantages` (B, T); entropy when verl computes it
    routing       route_flips, route_overlap and the routing table, from the batch's
                  `routed_experts` (the rollout's, with rollout.enable_rollout_routing_replay)
                  on the engine workers under router replay R3 (verl 0.9.1: a Megatron or
                  VeOmni actor, `actor.<strategy>.router_replay.mode=R3`; 0.7.1: Megatron):
                  π replays μ's routing, both sides are μ's, 0 flips. Nothing under R2
                  (`routed_experts` is then the trainer's own π_old routing; μ's is in no
                  batch), with replay disabled, on the FSDP engine, or on verl 0.7's legacy
                  FSDP workers (no router replay). The `routing` module cites verl's lines.

Every rule but the top-K ones is evaluated counterfactually. verl's loss is mapped to the rule
that blocks the same tokens (`verl_active_rule`); where none does, run.json says so instead of
naming a wrong rule. The driver (`_update_actor` and `fit` of `RayPPOTrainer` and of verl 0.9's
default v1 `PPOTrainer`) records each step's samples (prompt and response text, reward, sequence
advantage, length) and every number verl logs (as `verl/<name>`), and marks the run finished, or
failed with the error, when `fit` returns.

Ranks: rank 0 is the driver; the worker of verl data-parallel rank r writes tokens as rank r + 1
(one rank per tensor- or sequence-parallel group records: verl's model-parallel source rank).
Tested on verl 0.9.1 (`main_ppo` end to end, and engine workers) and 0.7.1 (legacy workers);
docs/attach.md says how.
Steps: verl's global step (sent by the driver with the batch), else the count of the worker's
update calls. `update`: the mini-batch update within the step. Sample ids: the driver numbers the
step's samples and sends each row's id with the batch (a per-row field, `trustlens_sample`); a
worker records a row under the id it came with, else under its content id
(`trustlens.integrations._ray_hooks` says where that fallback falls short).

Every name is importable from here; the code is in this package's `compat` (the verl releases
supported, `UnsupportedVerlVersion`), `rules` (`verl_active_rule`), `routing` (the routed
experts verl carries, with verl's file:line), `sampling` (run.json's `sampling`), `state` (what
the hooks of one process share), `workers` (the training workers' hooks), `driver` (the
driver's hooks) and `stop` (TRUSTLENS_STOP_ON). This package and the modules that read verl's
configs (`rules`, `routing`, `sampling`, `stop`) import without verl installed;
importing the package patches verl where it is installed, and `setup` names the extra to install
where it is not.
"""

from __future__ import annotations

import contextlib
import importlib.util
import warnings

from trustlens.integrations.verl.compat import MAX_TESTED_VERL, MIN_VERL, UnsupportedVerlVersion, check_verl
from trustlens.integrations.verl.driver import patch_driver
from trustlens.integrations.verl.rules import verl_active_rule
from trustlens.integrations.verl.sampling import verl_sampling
from trustlens.integrations.verl.state import STATE
from trustlens.integrations.verl.workers import patch_dp_actor, patch_engine_workers

__all__ = [
    "MAX_TESTED_VERL",
    "MIN_VERL",
    "UnsupportedVerlVersion",
    "setup",
    "verl_active_rule",
    "verl_sampling",
]


def setup() -> None:
    """Patch verl in this process (idempotent): the training workers' loss and the driver's
    trainer. Called on import; also usable as Ray's `worker_process_setup_hook`."""
    if STATE["patched"]:
        return
    version = check_verl()
    STATE["patched"], STATE["version"] = True, str(version)
    try:
        with contextlib.suppress(ImportError):  # a verl without engine workers
            patch_engine_workers()
        with contextlib.suppress(ImportError):  # verl 0.9 has no legacy dp_actor
            patch_dp_actor()
    except AttributeError as err:  # a function the hook wraps is gone
        raise UnsupportedVerlVersion(f"verl {version} lacks what trustlens hooks: {err}") from err
    try:
        patch_driver()
    except ImportError as err:
        warnings.warn(f"trustlens: verl's trainer could not be hooked ({err}); samples are not recorded", stacklevel=2)


if importlib.util.find_spec("verl") is not None:  # without verl, `setup` names the extra to install
    setup()
