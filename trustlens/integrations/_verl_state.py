"""What the verl hooks of one process share: `_state` (whether verl is patched in this process,
the worker's WorkerRecording, or False on a rank that does not record, and the driver's
TokenRecorder), `_STEP_KEY`, the batch key under which the driver sends its global step to the
workers, and `_SAMPLE_KEY`, the per-row field of the batch holding each row's sample id."""

from __future__ import annotations

from typing import Any

from trustlens.integrations._external import SAMPLE_KEY as _SAMPLE_KEY
from trustlens.integrations._external import STEP_KEY as _STEP_KEY

__all__ = ["_SAMPLE_KEY", "_STEP_KEY", "_state"]

_state: dict[str, Any] = {"patched": False, "worker": None, "driver": None}
