"""The errors and warnings of the run format."""

from __future__ import annotations


class NotARunError(ValueError):
    """The path is not a readable trustlens run directory."""


class NoRowsError(ValueError):
    """The run has no rows in the table asked for (yet)."""


class RunWarning(UserWarning):
    """Part of a run could not be read and was skipped (the file is named); the rest loads."""


class CorruptPartWarning(RunWarning):
    """A part file could not be read (truncated, corrupt, checksum mismatch) and was skipped."""


class RejectedInputError(ValueError):
    """A `record` call's input held a value not allowed (NaN, ±inf, a log-probability > 0, a
    negative divergence, an id outside [0, 2³¹)), found by the writer thread on its copy after
    the call returned: that call's rows were not recorded. Raised by the next call."""


class WriterError(RuntimeError):
    """The writer of a run failed or is stuck; raised in the caller's thread with the cause."""


class RunLockedError(RuntimeError):
    """Another writer (this process or another) holds the rank of the run directory."""
