"""One training rank of tests/integrations/test_verl.py, run as a script:

    python verl_rank.py RANK WORLD PORT RUN_DIR OUT_JSON PATH BATCHES

It runs verl_actor.py's rank (verl's own actor code, PATH `engine` or `dp_actor`, on its shares
of the batches the driver left in BATCHES) with
every call of verl's policy loss spied on (its registry entry wrapped): the tensors the loss got
(log π, π_old and advantages at the response mask) go to OUT_JSON, for the test to compare with
the recorded run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # verl_cpu
import verl_actor


def spy_policy_loss(calls: list) -> None:
    """Wrap verl's vanilla policy loss so that every call's tensors are kept."""
    from verl.trainer.ppo import core_algos

    original = core_algos.POLICY_LOSS_REGISTRY["vanilla"]

    def spy(old_log_prob, log_prob, advantages, response_mask, **kwargs):
        m = response_mask.bool()
        calls.append(
            {k: t.detach()[m].tolist() for k, t in (("pi", log_prob), ("old", old_log_prob), ("adv", advantages))}
        )
        return original(
            old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask, **kwargs
        )

    core_algos.POLICY_LOSS_REGISTRY["vanilla"] = spy


if __name__ == "__main__":
    rank, world, port, run_dir, out, path, batches = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:8]
    calls: list = []
    spy_policy_loss(calls)
    verl_actor.run_rank(rank, world, port, run_dir, path, batches)
    Path(out).write_text(json.dumps(calls))
