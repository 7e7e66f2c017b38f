"""Tests of flowstd.models: the standard library's tiny media models (skipped without torch)."""
