"""Where trustlens finds its shipped artefacts (warm-start checkpoint, tokenizer, sample run).

They live in the repository's top-level `data/` folder; an installed wheel carries the same files
under `<prefix>/share/trustlens/data`. `TRUSTLENS_DATA` overrides both.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_SOURCE_DATA = Path(__file__).resolve().parent.parent / "data"
_INSTALLED_DATA = Path(sys.prefix) / "share" / "trustlens" / "data"


def data_dir() -> Path:
    """The folder of shipped artefacts: $TRUSTLENS_DATA, the checkout's data/, or the installed copy."""
    env = os.environ.get("TRUSTLENS_DATA")
    if env:
        return Path(env)
    for candidate in (_SOURCE_DATA, _INSTALLED_DATA):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"trustlens data folder not found (looked in {_SOURCE_DATA} and {_INSTALLED_DATA}); "
        "set TRUSTLENS_DATA to the folder holding the warm-start checkpoint and sample run"
    )


def data_path(*parts: str) -> Path:
    """A path inside the data folder, e.g. data_path("warmstart")."""
    return data_dir().joinpath(*parts)
