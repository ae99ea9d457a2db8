"""What the verl hooks of one process share: `_state` (whether verl is patched in this process,
the worker's WorkerRecording, or False on a rank that does not record, and the driver's
TokenRecorder). The keys under which the driver sends its step and each row's sample id to the
workers are `_external.STEP_KEY` and `_external.SAMPLE_KEY`."""

from __future__ import annotations

from typing import Any

__all__ = ["_state"]

_state: dict[str, Any] = {"patched": False, "worker": None, "driver": None}
