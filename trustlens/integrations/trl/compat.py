"""What the TRL hook relies on in the installed TRL: the supported releases, the private
`GRPOTrainer` methods it wraps and the keys of TRL's batch dict it reads.

TRL's private methods change between releases: `check_trl` checks at class creation that the
ones the hook wraps exist (the hook takes extra arguments through), and the hook raises
`UnsupportedTRLVersion`, naming the installed version, when something it relies on is missing.
"""

from __future__ import annotations

from packaging.version import Version

from trustlens.core.extras import import_extra
from trustlens.integrations.versions import check_version

# imported first of the integration's modules: a missing TRL names the extra that installs it
trl = import_extra("trl")
GRPOTrainer = trl.GRPOTrainer

# TRL releases this integration supports: tests/test_integrations_trl.py passes on 0.29.1, 1.0.0,
# 1.8.0 and 1.16.0 (older TRL does not import with transformers 5). An older release is refused, a
# newer one is tried with a warning.
MIN_TRL = Version("0.29.0")
MAX_TESTED_TRL = Version("1.16.0")

# the private GRPOTrainer methods the hook wraps
_WRAPPED = (
    "_generate_and_score_completions",
    "_compute_loss",
    "_get_per_token_logps_and_entropies",
    "_calculate_rewards",
)
# keys of TRL's batch dict the hook reads
BATCH_KEYS = ("prompt_ids", "completion_ids", "completion_mask", "advantages")


class UnsupportedTRLVersion(RuntimeError):
    """The installed TRL lacks something the trustlens hook relies on."""


def unsupported(what: str) -> UnsupportedTRLVersion:
    """The UnsupportedTRLVersion to raise when `what` is missing, naming the installed TRL."""
    return UnsupportedTRLVersion(
        f"trustlens.integrations.trl: {what} (installed trl {trl.__version__}; supported "
        f"trl {MIN_TRL} to {MAX_TESTED_TRL})"
    )


def check_trl(trainer_cls: type) -> None:
    """Raise UnsupportedTRLVersion when `trainer_cls` or the installed TRL cannot be hooked."""
    if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, GRPOTrainer)):
        raise TypeError(f"with_trustlens expects GRPOTrainer or a subclass of it, got {trainer_cls!r}")
    check_version("trl", MIN_TRL, MAX_TESTED_TRL, UnsupportedTRLVersion)
    missing = [name for name in _WRAPPED if not callable(getattr(trainer_cls, name, None))]
    if missing:
        raise unsupported(f"{trainer_cls.__name__} has no method {', '.join(missing)}")
