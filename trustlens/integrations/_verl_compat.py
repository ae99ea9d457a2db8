"""What the verl hooks rely on in the installed verl: the releases this integration supports
(`MIN_VERL`: an older verl is refused with `UnsupportedVerlVersion`; one newer than
`MAX_TESTED_VERL` is tried with a warning) and the installed version. verl is imported only when
they are called.
"""

from __future__ import annotations

from packaging.version import Version

from trustlens.core.extras import import_extra
from trustlens.integrations._external import warn_untested

MIN_VERL = Version("0.7.0")
# tests/integrations/test_verl.py passes on verl 0.7.1 and 0.9.1
MAX_TESTED_VERL = Version("0.9.1")


class UnsupportedVerlVersion(RuntimeError):
    """The installed verl is older than this integration supports, or lacks a hooked function."""


def _check_version() -> None:
    verl = import_extra("verl")  # a missing verl names the extra that installs it
    version = Version(verl.__version__)
    if version < MIN_VERL:
        raise UnsupportedVerlVersion(f"trustlens.integrations.verl needs verl >= {MIN_VERL}, found {version}")
    if version.release[:2] > MAX_TESTED_VERL.release[:2]:
        warn_untested("verl", str(version), f"{MIN_VERL}–{MAX_TESTED_VERL}")


def _verl_version() -> str:
    verl = import_extra("verl")
    return str(verl.__version__)
