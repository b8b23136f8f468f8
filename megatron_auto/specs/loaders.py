"""Load a model or cluster spec by preset name or from a JSON file (the --model and --cluster arguments)."""
from __future__ import annotations

from pathlib import Path

from .. import serde
from ..errors import UserError
from .cluster import ClusterSpec
from .model import ModelSpec, model_from_dict
from .presets import CLUSTER_PRESETS, MODEL_PRESETS


def load_model(name_or_path: str) -> ModelSpec:
    """A preset by name, or a JSON model file (compact or rich form)."""
    if name_or_path in MODEL_PRESETS:
        return MODEL_PRESETS[name_or_path]
    if not name_or_path.endswith(".json") and not Path(name_or_path).exists():
        raise UserError(f"unknown model preset '{name_or_path}'; choose one of: {', '.join(MODEL_PRESETS)} or give a .json file")
    path = Path(name_or_path)
    return model_from_dict(serde.read_json(name_or_path, "model"), path.stem, f"model '{path.name}'")


def load_cluster(name_or_path: str, num_nodes: int | None = None) -> ClusterSpec:
    """A preset by name, or a JSON cluster file; `num_nodes` overrides the node count."""
    if name_or_path in CLUSTER_PRESETS:
        cluster = CLUSTER_PRESETS[name_or_path]
    elif name_or_path.endswith(".json") or Path(name_or_path).exists():
        data = serde.read_json(name_or_path, "cluster")
        cluster = serde.from_dict(ClusterSpec, data, f"cluster '{Path(name_or_path).name}'")
    else:
        raise UserError(f"unknown cluster preset '{name_or_path}'; choose one of: {', '.join(CLUSTER_PRESETS)} or give a .json file")
    return cluster.with_nodes(num_nodes) if num_nodes is not None else cluster
