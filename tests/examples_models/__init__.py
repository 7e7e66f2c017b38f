"""Tests of the examples that run real (tiny) models: examples/chat and examples/pd_split."""
