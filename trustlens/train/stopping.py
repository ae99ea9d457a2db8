"""`trustlens train --stop-on {critical,warning,never}`: stop on a live alert, keeping the weights
from before it.

With `stop_on` other than "never" the run's recorder raises live alerts (trustlens.live) and the
trainer keeps a rolling checkpoint: every `checkpoint_every` steps, before that step's update, the
weights as they are then, in RUN/checkpoints/step-NNNNNN/ (safetensors weights, config,
tokenizer, meta: the folder format of `trustlens.train.model.save_checkpoint`, usable as a warm
start with `--checkpoint`). Kept: the last KEPT checkpoints, and for each alert of warning or
above raised so far the last checkpoint from before its first step (an alert can turn critical
long after it was first raised); the others are deleted.

After each step the trainer asks for the alerts the writer thread raised so far. On the first of
severity `stop_on` or above (critical and doctor problems rank alike; `warning` stops on either),
the run stops after that step: every checkpoint taken after the alert's first step is deleted, so
the last one kept holds the weights from before the alert's first step, and run.json's `stopped`
says why: {on, alert: {kind, step, severity, raised_at_step, message}, step (the last step
trained), checkpoint (the kept folder, relative to the run, or null when none was taken before
the alert)}. The alerts are judged on the writer thread, so the trainer sees an alert after the
step that raised it, or a step or two later when the writer is behind; `step` says which.
Under torchrun rank 0 judges and decides, and every rank stops at the same step.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from trustlens.live.alert import LiveAlert
from trustlens.live.stop import first_at, stop_level, stopped_entry
from trustlens.train.world import World, all_reduce_

KEPT = 3  # rolling checkpoints kept (an alert reaches the trainer within a step or two of its first step)
FOLDER = "checkpoints"  # inside the run directory


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


class AlertStop:
    """The rolling checkpoints and the stop decision of one run (module docstring)."""

    def __init__(self, stop_on: str, every: int, run_dir: Path | None, world: World) -> None:
        self.level = stop_level(stop_on)
        self.stop_on, self.every, self.world = stop_on, every, world
        self.folder = None if run_dir is None else run_dir / FOLDER
        self.taken: list[int] = []  # steps of the checkpoints kept, oldest first
        self.found: LiveAlert | None = None  # the alert the run stops on (rank 0)

    @property
    def active(self) -> bool:
        return self.level is not None and self.folder is not None

    def checkpoint(self, step: int, model: Any, tokenizer: Any, recorder: Any) -> None:
        """Before step `step`'s update: save the weights every `every` steps (rank 0), and delete
        the checkpoints no longer needed (module docstring)."""
        if not self.active or step % self.every or not self.world.main:
            return
        from trustlens.train.model import save_checkpoint

        assert self.folder is not None
        save_checkpoint(model, tokenizer, self.folder / checkpoint_name(step), {"step": step, "before_update": True})
        self.taken.append(step)
        needed = set(self.taken[-KEPT:])
        for alert in recorder.live_alerts:
            before = [s for s in self.taken if s <= alert.step]
            if alert.level >= 1 and before:
                needed.add(before[-1])
        for taken in [s for s in self.taken if s not in needed]:
            shutil.rmtree(self.folder / checkpoint_name(taken), ignore_errors=True)
        self.taken = sorted(needed)

    def due(self, recorder: Any) -> bool:
        """Whether a live alert at `stop_on` or above was raised so far (rank 0 judges; every rank
        gets its answer); the alert is then `self.found` (on rank 0)."""
        if not self.active:
            return False
        assert self.level is not None
        self.found = first_at(recorder.live_alerts, self.level)
        flag = torch.tensor([1.0 if self.found is not None else 0.0])
        return bool(all_reduce_(flag, "max").item())

    def stop(self, step: int, recorder: Any) -> dict | None:
        """Keep the last checkpoint from before the alert's first step and say why in run.json
        (rank 0; None on the other ranks)."""
        alert = self.found
        if alert is None or self.folder is None:
            return None
        for taken in [s for s in self.taken if s > alert.step]:
            shutil.rmtree(self.folder / checkpoint_name(taken), ignore_errors=True)
        self.taken = [s for s in self.taken if s <= alert.step]
        kept = f"{FOLDER}/{checkpoint_name(self.taken[-1])}" if self.taken else None
        why = stopped_entry(self.stop_on, alert, step, kept)
        recorder.annotate({"stopped": why})
        return why


def alert_postfix(alerts: list) -> dict[str, str]:
    """The progress line's alert field: how many alerts of warning or above so far and the most
    severe latest one ({} without any)."""
    shown = [a for a in alerts if a.level >= 1]
    if not shown:
        return {}
    worst = max(shown, key=lambda a: (a.level, a.raised_at_step))
    return {"alerts": f"{len({a.key for a in shown})} ({worst.severity} {worst.kind} @{worst.step})"}


__all__ = ["FOLDER", "KEPT", "AlertStop", "alert_postfix", "checkpoint_name"]
