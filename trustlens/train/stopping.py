"""`trustlens train --stop-on {critical,warning,never}`: stop on a live alert, keeping the last
weights from before the alert's evidence began.

With `stop_on` other than "never" the run's recorder raises live alerts (trustlens.live) and the
trainer keeps rolling checkpoints: every `checkpoint_every` steps and at every held-out
evaluation, before that step's update, the weights as they are then (the weights the step's
evaluation measures), in RUN/checkpoints/step-NNNNNN/ (safetensors weights, config, tokenizer,
meta: the folder format of `trustlens.train.model.save_checkpoint`, usable as a warm start with
`--checkpoint`). Kept: the last `keep_checkpoints`, plus the ones a stop would keep now
(`trustlens.live.stop.kept_checkpoint` for the evidence start of each alert that may
still reach `stop_on` or be the evidence of one — those still provisional, and collapse warnings
that ended within the detectors' evidence rows — and of alerts not raised yet: `unconfirmed_start`, a held-out
accuracy fall under way (`AccuracyFall.began`, which may be evaluations back), and the latest evaluated checkpoint
for the next evaluation); the others are deleted, so that at most `keep_checkpoints` + 2 + one per
such alert are on disk.

After each step the trainer asks for the alerts the writer thread raised so far. On the first of
severity `stop_on` or above (critical and doctor problems rank alike; `warning` stops on either),
the run stops after that step: the checkpoint kept is the last one whose held-out evaluation came
before the alert's evidence began (`trustlens.live.stop`), every other one is deleted, and
run.json's `stopped` says why (`stopped_entry`): the alert, the last step trained, the evidence's
first step, the kept folder (relative to the run, or null when none was taken before the
evidence), its step and held-out accuracy. The run then ends with status `stopped` and `trustlens
train` exits with EXIT_ALERT_STOP (4). The alerts are judged on the writer thread, so the trainer
sees an alert after the step that raised it, or a step or two later when the writer is behind;
`step` says which. Under torchrun rank 0 judges and decides, and every rank stops at the same
step.
"""

from __future__ import annotations

import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch

from trustlens.analysis.collapse.config import CollapseConfig
from trustlens.analysis.collapse.heldout import AccuracyFall
from trustlens.live.alert import LiveAlert
from trustlens.live.stop import evidence_start, first_at, kept_checkpoint, stop_level, stopped_entry
from trustlens.train.world import World, all_reduce_

FOLDER = "checkpoints"  # inside the run directory


# the detectors' settings: the trainer's recorder judges with the default CollapseConfig (alerts=True)
COLLAPSE_CONFIG = CollapseConfig()


def unconfirmed_start(judged: int, evaluated: Collection[int]) -> int:
    """The earliest step the evidence of an alert not raised yet may begin at, once the steps up
    to `judged` are judged: a step detector opens its episode on its `confirm_steps`-th flagged
    step in a row (its first flagged step may be judged already), an accuracy fall on the
    evaluation after the first low one (the last evaluation judged, among `evaluated` steps)."""
    first = judged + 1 - (COLLAPSE_CONFIG.confirm_steps - 1)
    last_evaluation = max((s for s in evaluated if s <= judged), default=first)
    return min(first, last_evaluation)


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


class AlertStop:
    """The rolling checkpoints and the stop decision of one run (module docstring). `every`:
    steps between rolling checkpoints; `keep`: rolling checkpoints kept besides the ones a stop
    would keep."""

    def __init__(
        self, stop_on: str, every: int, keep: int, run_dir: Path | None, world: World, eval_size: int | None = None
    ) -> None:
        self.level = stop_level(stop_on)
        self.stop_on, self.every, self.keep, self.world = stop_on, every, keep, world
        self.folder = None if run_dir is None else run_dir / FOLDER
        self.taken: list[int] = []  # steps of the checkpoints on disk, oldest first
        self.evaluated: dict[int, float] = {}  # checkpoint step -> held-out accuracy of its weights
        self.found: LiveAlert | None = None  # the alert the run stops on (rank 0)
        # the held-out accuracy's fall as accuracy_drop follows it (`eval_size` problems an
        # evaluation): where a fall not confirmed yet began, which may be evaluations back
        self.fall = AccuracyFall(COLLAPSE_CONFIG, eval_size)

    @property
    def active(self) -> bool:
        return self.level is not None and self.folder is not None

    def checkpoint(self, step: int, model: Any, tokenizer: Any, recorder: Any, accuracy: float | None) -> None:
        """Before step `step`'s update: save the weights every `every` steps and at an
        evaluation (`accuracy`: its held-out accuracy, None when the step was not evaluated;
        rank 0), and delete the checkpoints no longer needed (module docstring)."""
        if not self.active or not self.world.main or (step % self.every and accuracy is None):
            return
        from trustlens.train.model import save_checkpoint

        assert self.folder is not None
        meta = {"step": step, "before_update": True, "eval_accuracy": accuracy}
        save_checkpoint(model, tokenizer, self.folder / checkpoint_name(step), meta)
        self.taken.append(step)
        if accuracy is not None:
            self.evaluated[step] = accuracy
            self.fall.push(step, accuracy)
        self._keep_only({*self.taken[-self.keep :], *self._pending(recorder)})

    def _pending(self, recorder: Any) -> set[int]:
        """The checkpoints a stop would keep (module docstring): for the earliest evidence start
        of the alerts that may still stop the run or be a stopping alert's evidence, and of an
        alert not raised yet; and the latest evaluated one, for a fall the next evaluation begins."""
        judged = recorder.live_judged_step  # first: the alerts read after it hold its step's
        if judged is None:  # nothing judged yet: evidence may begin at step 0, before every checkpoint
            return set()
        latest: dict[tuple, LiveAlert] = {}
        for alert in recorder.live_alerts:
            latest[alert.key] = alert
        assert self.level is not None
        recent = judged - COLLAPSE_CONFIG.evidence_rows
        starts = [
            evidence_start(a)
            for a in latest.values()
            if a.provisional or a.level >= self.level or (a.source == "collapse" and a.end_step >= recent)
        ]
        began = [] if self.fall.began is None else [self.fall.began]  # a fall the CUSUM follows
        # each candidate's own checkpoint: the alert that stops the run keeps the one before its
        # evidence, which is not the one before the earliest evidence among several
        candidates = {*starts, *began, unconfirmed_start(judged, self.evaluated), judged + 1}
        kept = {kept_checkpoint(self.taken, self.evaluated, s) for s in candidates}
        return {s for s in kept if s is not None}

    def _keep_only(self, needed: set[int]) -> None:
        assert self.folder is not None
        for taken in [s for s in self.taken if s not in needed]:
            shutil.rmtree(self.folder / checkpoint_name(taken), ignore_errors=True)
        self.taken = sorted(needed & set(self.taken))

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
        """Keep the last checkpoint whose evaluation came before the alert's evidence, delete the
        others and say why in run.json (rank 0; None on the other ranks)."""
        alert = self.found
        if alert is None or self.folder is None:
            return None
        kept = kept_checkpoint(self.taken, self.evaluated, evidence_start(alert))
        self._keep_only(set() if kept is None else {kept})
        why = stopped_entry(
            self.stop_on,
            alert,
            step,
            None if kept is None else f"{FOLDER}/{checkpoint_name(kept)}",
            checkpoint_step=kept,
            checkpoint_accuracy=None if kept is None else self.evaluated.get(kept),
        )
        recorder.annotate({"stopped": why})
        return why


__all__ = ["FOLDER", "AlertStop", "checkpoint_name"]
