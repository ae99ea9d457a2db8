"""Test-only stand-in (see ../../README.md)."""

from flash_attn.bert_padding import _absent as all_gather  # noqa: F401
