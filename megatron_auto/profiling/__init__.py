"""Measurement code behind `megatron-auto profile-cluster` and `profile-model`.

This package imports torch (and, for layers, megatron.core); the planner never
imports it. What it measures is written as the torch-free records of
megatron_auto/specs/profiles.py, which the cost model reads (`--profile`).
"""
