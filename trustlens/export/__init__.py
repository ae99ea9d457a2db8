"""Exports of recorded runs to TensorBoard and W&B, after the run (`trustlens export`) or live
(`TokenRecorder(..., mirror=...)`). docs/export.md."""

from trustlens.export.exporters import driving_tokens, export_run, export_tensorboard, export_wandb
from trustlens.export.mirror import StepMirror, make_mirror
from trustlens.export.scalars import alert_text, step_scalars, token_scalars
from trustlens.export.sinks import TensorBoardSink, WandbSink

__all__ = [
    "StepMirror",
    "TensorBoardSink",
    "WandbSink",
    "alert_text",
    "driving_tokens",
    "export_run",
    "export_tensorboard",
    "export_wandb",
    "make_mirror",
    "step_scalars",
    "token_scalars",
]
