"""The one check of an installed framework's release that every integration makes: older than
the oldest supported release is refused, a newer minor series than the newest tested one is
tried with a warning.

    version = check_version("verl", "0.7.0", "0.9.1", UnsupportedVerlVersion)
"""

from __future__ import annotations

import importlib.metadata
import warnings

from packaging.version import Version

from trustlens.core.extras import import_extra


def check_version(
    name: str, minimum: str | Version, tested: str | Version, error: type[Exception] = RuntimeError
) -> Version:
    """The installed release of framework `name` (its module's `__version__`, else its
    distribution's), checked against the releases an integration supports: older than `minimum`
    raises `error`, naming both; a newer major.minor than `tested` (the newest release its tests
    pass on) warns and is tried. A missing framework with an extra (trl, verl) names that extra."""
    module = import_extra(name)
    installed = Version(getattr(module, "__version__", None) or importlib.metadata.version(name))
    supported = f"supported: {name} {minimum} to {tested}"
    if installed < Version(str(minimum)):
        raise error(
            f"trustlens.integrations.{name}: {name} {installed} is older than the oldest supported release "
            f"({supported})"
        )
    if installed.release[:2] > Version(str(tested)).release[:2]:
        warnings.warn(
            f"trustlens: {name} {installed} is newer than the newest tested release ({tested}); trying it "
            f"(what it lacks raises {error.__name__})",
            stacklevel=3,
        )
    return installed


__all__ = ["check_version"]
