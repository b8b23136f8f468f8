"""Typed, versioned descriptions of the model, the cluster and the training run."""
from .cluster import ClusterSpec, ComputeEfficiency, GpuSpec, LinkSpec
from .loaders import load_cluster, load_model
from .model import LayerSpec, ModelSpec
from .training import TrainingSpec

__all__ = [
    "ClusterSpec", "ComputeEfficiency", "GpuSpec", "LinkSpec", "load_cluster",
    "LayerSpec", "ModelSpec", "load_model", "TrainingSpec",
]
