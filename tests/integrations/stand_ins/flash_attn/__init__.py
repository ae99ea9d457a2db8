"""Test-only stand-in for flash_attn (see ../README.md): the names OpenRLHF imports at load time."""
