"""Test-only stand-in (see ../../README.md)."""
