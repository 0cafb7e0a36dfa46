"""Benchmarks: shapes and presets shared by tests and benchmark scripts, timing, peers."""
