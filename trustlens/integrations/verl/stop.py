"""Stopping a verl run on trustlens' live alerts: with TRUSTLENS_STOP_ON=critical (or warning) in
the driver's environment, the first alert at that severity lowers the trainer's
`total_training_steps` to the current step; verl's own loop then runs its last step (saving a
checkpoint when `trainer.save_freq` > 0, validating) and returns, and run.json's `stopped` says
why."""

from __future__ import annotations

import os
from typing import Any

from trustlens.integrations.verl.state import STATE
from trustlens.record import TokenRecorder

# the environment variable naming the severity the driver stops a verl run on (trustlens.live.stop)
ENV_STOP_ON = "TRUSTLENS_STOP_ON"


def stop_on_from_env() -> str:
    """TRUSTLENS_STOP_ON: critical, warning or never (default); a ValueError naming the variable
    for anything else."""
    from trustlens.core.argument_checks import check_stop_on

    return check_stop_on(ENV_STOP_ON, os.environ.get(ENV_STOP_ON) or "never")


def stop_if_due(trainer: Any, recorder: TokenRecorder, step: int) -> None:
    """TRUSTLENS_STOP_ON: on the first alert at that severity, make verl's next step its last."""
    from trustlens.live.stop import first_at, stop_level, stopped_entry

    stop_on = stop_on_from_env()
    alert = first_at(recorder.live_alerts, stop_level(stop_on))
    if alert is None or trainer is None or STATE.get("stopping"):
        return
    STATE["stopping"] = True
    trainer.total_training_steps = min(int(trainer.total_training_steps), int(trainer.global_steps))
    recorder.annotate({"stopped": stopped_entry(stop_on, alert, step, None)})  # verl saves its last step itself


__all__ = ["ENV_STOP_ON", "stop_if_due", "stop_on_from_env"]
