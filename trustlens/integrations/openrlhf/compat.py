"""What the OpenRLHF hooks rely on in the installed OpenRLHF: the releases this integration
supports (`MIN_OPENRLHF`: an older one is refused with `UnsupportedOpenRLHFVersion`; a newer minor
series than `MAX_TESTED_OPENRLHF` is tried with a warning). OpenRLHF is imported only when
`check_openrlhf` is called."""

from __future__ import annotations

from packaging.version import Version

from trustlens.integrations.versions import check_version

# tests/integrations/test_openrlhf.py passes on 0.11.2; 0.11 reorganised the trainer's arguments
MIN_OPENRLHF = Version("0.11.0")
MAX_TESTED_OPENRLHF = Version("0.11.2")


class UnsupportedOpenRLHFVersion(RuntimeError):
    """The installed OpenRLHF is older than this integration supports."""


def check_openrlhf() -> Version:
    """The installed OpenRLHF's version; UnsupportedOpenRLHFVersion when it is too old."""
    return check_version("openrlhf", MIN_OPENRLHF, MAX_TESTED_OPENRLHF, UnsupportedOpenRLHFVersion)


__all__ = ["MAX_TESTED_OPENRLHF", "MIN_OPENRLHF", "UnsupportedOpenRLHFVersion", "check_openrlhf"]
