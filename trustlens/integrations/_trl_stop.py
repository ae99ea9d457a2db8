"""The TRL hook's live alerts: `stop_on` and `on_alert` of `TrustLensGRPOTrainer`.

With `stop_on` other than "never" (or an `on_alert`), the recorder the hook opens raises live
alerts (trustlens.live), judging each generation when the next one starts. After each optimizer
step the hook's callback asks for the alerts raised so far; on the first at `stop_on` or above it
sets `control.should_save` (the Trainer writes OUTPUT_DIR/checkpoint-<global step>) and
`control.should_training_stop`, and run.json's `stopped` names the alert, the generation the run
stopped at and that checkpoint. A recorder passed in (`recorder=`) stops the same way if it was
opened with `alerts=`.
"""

from __future__ import annotations

from typing import Any

from trustlens.live.stop import first_at, stop_level, stopped_entry
from trustlens.live.tap import check_on_alert


class AlertStopper:
    """`stop_on` and `on_alert` of the hook, checked when the trainer is built."""

    def __init__(self, stop_on: str, on_alert: Any) -> None:
        self.stop_on = stop_on
        self.level = stop_level(stop_on)
        self.on_alert = check_on_alert(on_alert)
        self.alerts = self.level is not None or self.on_alert is not None  # the recorder raises live alerts
        self.done = False

    def due(self, recorder: Any) -> bool:
        """Whether the run should stop now (once)."""
        if self.done or self.level is None:
            return False
        return first_at(getattr(recorder, "live_alerts", []), self.level) is not None

    def stop(self, recorder: Any, step: int, checkpoint: str) -> None:
        alert = first_at(recorder.live_alerts, self.level)
        assert alert is not None
        self.done = True
        recorder.annotate({"stopped": stopped_entry(self.stop_on, alert, step, checkpoint)})


def planned_generations(args: Any) -> int | None:
    """The generations (trustlens steps) a TRL run plans: max_steps optimizer steps of
    gradient_accumulation_steps micro-batches, steps_per_generation micro-batches per generation;
    None without max_steps."""
    max_steps = getattr(args, "max_steps", -1) or -1
    if max_steps <= 0:
        return None
    micro = max_steps * max(getattr(args, "gradient_accumulation_steps", 1) or 1, 1)
    per_generation = max(getattr(args, "steps_per_generation", None) or 1, 1)
    return max(1, -(-micro // per_generation))


__all__ = ["AlertStopper", "planned_generations"]
