"""The optional extras: which extra installs a missing package, and an import that says so (a
missing torch, trl or verl names `pip install "trustlens[EXTRA]"` instead of a bare
ModuleNotFoundError)."""

from __future__ import annotations

import importlib
from types import ModuleType

# packages of the optional extras -> the extra that installs them
_EXTRA_OF = {
    "torch": "torch",
    "transformers": "torch",
    "tokenizers": "torch",
    "safetensors": "torch",
    "trl": "trl",
    "verl": "verl",
}


def missing_extra(err: ImportError) -> str | None:
    """For an ImportError of a package an extra provides, the message saying which to install."""
    package = (getattr(err, "name", None) or "").partition(".")[0]
    extra = _EXTRA_OF.get(package)
    if extra is None:
        return None
    return (
        f'this needs {package}, which is not installed; install the extra: pip install "trustlens[{extra}]" '
        "(reading runs, the analyses and the dashboard need no torch)"
    )


def import_extra(package: str) -> ModuleType:
    """`import package`, a package of an optional extra; when it is missing, an ImportError whose
    message names the extra to install (`missing_extra`) instead of a bare ModuleNotFoundError."""
    try:
        return importlib.import_module(package)
    except ImportError as err:
        message = missing_extra(err)
        if message is None:
            raise
        raise ImportError(message, name=err.name) from err


__all__ = ["import_extra", "missing_extra"]
