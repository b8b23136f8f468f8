"""Validation harnesses and checks, each run from the repository root as `python -m validation.NAME`."""
