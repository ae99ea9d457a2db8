"""What the verl hooks rely on in the installed verl: the releases this integration supports
(`MIN_VERL`: an older verl is refused with `UnsupportedVerlVersion`; a newer minor series than
`MAX_TESTED_VERL` is tried with a warning) and the installed version. verl is imported only when
they are called.
"""

from __future__ import annotations

from packaging.version import Version

from trustlens.integrations.versions import check_version

MIN_VERL = Version("0.7.0")
# tests/integrations/test_verl.py passes on verl 0.7.1 and 0.9.1
MAX_TESTED_VERL = Version("0.9.1")


class UnsupportedVerlVersion(RuntimeError):
    """The installed verl is older than this integration supports, or lacks a hooked function."""


def check_verl() -> Version:
    """The installed verl's version; UnsupportedVerlVersion when it is too old, a missing verl
    names the extra that installs it."""
    return check_version("verl", MIN_VERL, MAX_TESTED_VERL, UnsupportedVerlVersion)


__all__ = ["MAX_TESTED_VERL", "MIN_VERL", "UnsupportedVerlVersion", "check_verl"]
