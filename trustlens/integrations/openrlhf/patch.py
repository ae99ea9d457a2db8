"""`setup`: patch OpenRLHF in this process, the actors' hooks and the driver's."""

from __future__ import annotations

from trustlens.integrations.openrlhf.compat import check_openrlhf
from trustlens.integrations.openrlhf.driver import patch_driver
from trustlens.integrations.openrlhf.state import STATE
from trustlens.integrations.openrlhf.workers import patch_actor


def setup() -> None:
    """Patch OpenRLHF in this process (idempotent); Ray's `worker_process_setup_hook`."""
    if STATE["patched"]:
        return
    check_openrlhf()
    STATE["patched"] = True
    patch_actor()
    patch_driver()


__all__ = ["setup"]
