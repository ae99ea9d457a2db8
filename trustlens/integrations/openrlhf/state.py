"""What the OpenRLHF hooks of one process share: `STATE` (whether OpenRLHF is patched in this
process, the actor's WorkerRecording, the driver's TokenRecorder, and the experience and sample
ids of the training step under way) and `ORIGINALS` (the BasePPOTrainer methods `setup` replaced
in this process, by name)."""

from __future__ import annotations

from typing import Any

STATE: dict[str, Any] = {"patched": False, "worker": None, "driver": None, "ctx": None}
ORIGINALS: dict[str, Any] = {}

__all__ = ["ORIGINALS", "STATE"]
