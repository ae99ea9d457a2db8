"""Stopping a TRL run on trustlens' live alerts: `TrustLensCallback`, and the generations a run
plans (the live alerts' baseline window).

The recorder raises live alerts (trustlens.live) when it was opened with `alerts=` (the
`TrustLensGRPOTrainer` opens its own so with `stop_on=` or `on_alert=`), judging each generation
when the next one starts. After each optimizer step the callback asks for the alerts raised so
far; on the first at `stop_on` or above it sets `control.should_save` (the Trainer writes
OUTPUT_DIR/checkpoint-<global step>) and `control.should_training_stop`, and run.json's
`stopped` names the alert, the generation the run stopped at and that checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from trustlens.core.argument_checks import check_attributes
from trustlens.live.stop import first_at, stop_level, stopped_entry


class TrustLensCallback(TrainerCallback):
    """A [`~transformers.TrainerCallback`] that saves and stops a TRL run recorded by trustlens on
    the first live alert at `stop_on` or above (module docstring).

    Usage:
    ```python
    from trustlens import TokenRecorder
    from trustlens.integrations.trl import TrustLensCallback, TrustLensGRPOTrainer

    with TokenRecorder("runs/grpo", alerts=True) as recorder:
        trainer = TrustLensGRPOTrainer(..., recorder=recorder, callbacks=[TrustLensCallback(recorder)])
        trainer.train()
    ```
    (`TrustLensGRPOTrainer(..., trustlens_dir=..., stop_on="critical")` attaches one itself.)

    Args:
        recorder (`TokenRecorder`):
            The recorder the trainer records into (its `recorder=`), opened with `alerts=` so that
            it raises live alerts; a recorder without them never stops the run.
        stop_on (`str`, *optional*, defaults to `"critical"`):
            `"critical"` (a critical collapse alert or a doctor problem), `"warning"` (either, or any
            warning) or `"never"`.
    """

    def __init__(self, recorder: Any, stop_on: str = "critical") -> None:
        self.recorder: Any = check_attributes("recorder", recorder, ("live_alerts", "annotate"), "a TokenRecorder")
        self.stop_on = stop_on
        self.level = stop_level(stop_on)  # a bad stop_on is refused here, before training
        self.step: Callable[[], int] | None = None  # the trustlens step the run is at (`bind`)
        self.done = False

    def bind(self, step: Callable[[], int]) -> None:
        """Take the run's trustlens step (a generation) from `step()`: the trainer's hook calls this."""
        self.step = step

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.step is None:
            raise ValueError(
                "TrustLensCallback stops a run that TrustLensGRPOTrainer (or another with_trustlens class) "
                "records: attach it to one, with the recorder it records into"
            )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.done or self.step is None:
            return
        alert = first_at(self.recorder.live_alerts, self.level)
        if alert is None:
            return
        self.done = True
        checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        self.recorder.annotate({"stopped": stopped_entry(self.stop_on, alert, self.step(), checkpoint)})
        control.should_save = True
        control.should_training_stop = True


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


__all__ = ["TrustLensCallback", "planned_generations"]
