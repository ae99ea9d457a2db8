"""What the verl hooks of one process share: `STATE` (whether verl is patched in this process and
the verl version `setup` found, the worker's WorkerRecording, or False on a rank that does not
record, the driver's TokenRecorder, the trainer whose loop a stop ends). The keys under which the
driver sends its step and each row's sample id to the workers are
trustlens.integrations._ray_hooks' `STEP_KEY` and `SAMPLE_KEY`."""

from __future__ import annotations

from typing import Any

STATE: dict[str, Any] = {"patched": False, "version": None, "worker": None, "driver": None}

__all__ = ["STATE"]
