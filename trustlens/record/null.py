"""NullRecorder: `TokenRecorder`'s API doing nothing, for runs (or ranks) that record nothing."""

from __future__ import annotations

from typing import Any

from trustlens.record.recorder import TokenRecorder
from trustlens.run.writer import WriterStats


class NullRecorder(TokenRecorder):
    """TokenRecorder's API doing nothing: swap it in to run without recording, at no cost
    (`TokenRecorder(..., enabled=False)` returns one)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.path = None  # type: ignore[assignment]
        self.rules = []

    @property
    def stats(self) -> WriterStats:
        return WriterStats()

    @property
    def run_id(self) -> str | None:
        return None

    def record(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def log_metrics(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_samples(self, *args: Any, **kwargs: Any) -> None:
        pass

    def end_step(self, step: int) -> None:
        pass

    def annotate(self, fields: Any) -> None:
        pass

    @property
    def live_alerts(self) -> list:
        return []

    @property
    def live_judged_step(self) -> int | None:
        return None

    def flush(self) -> None:
        pass

    def close(self, error: BaseException | None = None) -> None:
        pass

    def __enter__(self) -> NullRecorder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        pass


TokenRecorder.disabled_class = NullRecorder
