"""What the verl hooks of one process share: `_state` (whether verl is patched in this process,
the worker's WorkerRecording, or False on a rank that does not record, and the driver's
TokenRecorder) and `_STEP_KEY`, the batch key under which the driver sends its global step to
the workers."""

from __future__ import annotations

from typing import Any

_STEP_KEY = "trustlens_step"  # the driver's global step, sent to the workers with the batch
_state: dict[str, Any] = {"patched": False, "worker": None, "driver": None}
