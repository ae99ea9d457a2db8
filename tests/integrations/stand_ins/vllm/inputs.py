"""Test-only stand-in (see ../README.md)."""


class TokensPrompt(dict):
    pass
