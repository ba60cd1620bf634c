"""Benchmarks that print figures (speed targets are checked by reading them, not by timed asserts)."""
