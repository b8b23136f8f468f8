"""The cost model: pure functions of (layer, strategy, cluster) in seconds and bytes.

Only the standard library and numpy are imported here, so planning a 1024-GPU job
runs on a laptop. `estimate_plan` combines the terms into a Prediction.
"""
from .estimate import estimate_plan, model_flops_per_iteration

__all__ = ["estimate_plan", "model_flops_per_iteration"]
