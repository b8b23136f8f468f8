"""Measured profiles: collective curves of a cluster and layer timings of a model.

`megatron-auto profile-cluster` and `profile-model` (megatron_auto/profiling/,
which imports torch) write these records as versioned JSON; `--profile FILE` on
`plan` and `estimate` reads them back here, without torch, and attaches them to
the ClusterSpec (`ClusterSpec.measured`) so that the cost model's profiled
compute and communication models (cost/profiled.py) use them. They are frozen
and hashable (CachedHash) because the search memoises layer costs on the cluster.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from .. import serde
from ..errors import UserError
from ..serde import CachedHash, checked
from .model import LayerSpec, _check_version

PROFILE_SCHEMA_VERSION = 1
CLUSTER_PROFILE_KIND = "cluster-profile"
MODEL_PROFILE_KIND = "model-profile"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")


@dataclass(frozen=True)
class CollectiveCurve:
    """Median seconds of one collective against message size, for one group shape."""

    op: str
    """One of COLLECTIVES."""
    group_size: int = checked(positive=True)
    """Ranks in the group (2 for p2p)."""
    stride: int = checked(positive=True)
    """Rank distance between consecutive group members (1: consecutive ranks)."""
    inter_node: bool
    """True when the group spans more than one node."""
    message_bytes: tuple[int, ...]
    """Buffer sizes, ascending: the full (gathered / unreduced) buffer, as the cost model counts it."""
    seconds: tuple[float, ...]
    """Median wall-clock seconds of the collective at each size (max over ranks)."""

    def __post_init__(self) -> None:
        if self.op not in COLLECTIVES:
            raise ValueError(f"unknown collective {self.op!r}; expected one of {COLLECTIVES}")
        if len(self.message_bytes) != len(self.seconds) or not self.message_bytes:
            raise ValueError("message_bytes and seconds must be non-empty and of equal length")
        if list(self.message_bytes) != sorted(set(self.message_bytes)) or self.message_bytes[0] <= 0:
            raise ValueError("message_bytes must be positive and strictly ascending")


@dataclass(frozen=True)
class ClusterProfile(CachedHash):
    """What `profile-cluster` measured on one cluster."""

    __hash__ = CachedHash.__hash__  # dataclass(frozen=True) would otherwise replace it

    name: str
    """Label of the measured cluster."""
    backend: str
    """torch.distributed backend: nccl or gloo."""
    device: str
    """GPU name, or `cpu`."""
    world_size: int = checked(positive=True)
    """Ranks that took part."""
    gpus_per_node: int = checked(positive=True)
    """Ranks per node (LOCAL_WORLD_SIZE)."""
    curves: tuple[CollectiveCurve, ...]
    """One curve per (op, group size, stride)."""
    grad_overlap_fraction: float = checked(at_most=1.0, default=0.0)
    """Share of an all-reduce that ran hidden behind concurrent compute (0: none hidden)."""
    step_overhead_s: float = 0.0
    """Seconds per iteration the training runtime spends outside the layers, collectives and
    optimizer step the profiles time (validation/profile_runtime.py; 0: unmeasured)."""
    micro_batch_overhead_s: float = 0.0
    """Seconds the runtime spends per micro-batch per model chunk outside the profiled layers:
    schedule, batch, embedding, LM head and loss (validation/profile_runtime.py; 0: unmeasured)."""
    node_speeds: tuple[float, ...] = ()
    """Per node in node-rank order: its GPUs' measured matmul speed against the job's healthy ranks, in (0, 1]
    (profiling/node_speeds.py); planned with as --node-speeds is. (): not measured."""
    kind: str = CLUSTER_PROFILE_KIND
    """Record type tag, so `--profile` can tell the two kinds of file apart."""
    schema_version: int = PROFILE_SCHEMA_VERSION
    """Version of this record's layout."""

    def __post_init__(self) -> None:
        _check_version(self.schema_version, PROFILE_SCHEMA_VERSION, "cluster profile")
        if self.kind != CLUSTER_PROFILE_KIND:
            raise ValueError(f"kind must be {CLUSTER_PROFILE_KIND!r}")
        if any(not 0.0 < speed <= 1.0 for speed in self.node_speeds):
            raise ValueError(f"node_speeds are shares of the modelled speed, in (0, 1]: got {list(self.node_speeds)}")


@dataclass(frozen=True)
class LayerTiming:
    """One measured point: a layer at one sharded shape."""

    tp: int = checked(positive=True)
    """Tensor-parallel degree whose shard was run."""
    micro_batch: int = checked(positive=True)
    """Samples per micro-batch on the rank."""
    seq_length: int = checked(positive=True)
    """Tokens per sample."""
    forward_s: float
    """Median seconds of the forward pass."""
    backward_s: float
    """Median seconds of the backward pass (input and weight gradients)."""
    attention_core_forward_s: float
    """Median seconds of the attention core's forward (what selective recompute re-runs)."""
    activation_bytes: int
    """Bytes the forward pass saved for backward (saved-tensor hooks / CUDA memory stats)."""
    param_bytes: int
    """Bytes of the shard's weights."""

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_length


@dataclass(frozen=True)
class LayerProfile:
    """All measured points of one layer type."""

    layer: LayerSpec
    """The unsharded layer's shape."""
    timings: tuple[LayerTiming, ...]
    """Points over (tp, micro-batch, sequence length)."""


@dataclass(frozen=True)
class ModelProfile(CachedHash):
    """What `profile-model` measured for a model's layer types on one device."""

    __hash__ = CachedHash.__hash__  # dataclass(frozen=True) would otherwise replace it

    name: str
    """Label of the profiled model."""
    device: str
    """GPU name, or `cpu`."""
    precision: str
    """fp32, bf16 or fp16: the dtype the layers ran in."""
    concurrent_processes: int = checked(positive=True)
    """Identical benchmark processes run at once (ranks sharing the device's cores)."""
    layers: tuple[LayerProfile, ...]
    """One entry per distinct layer type."""
    optimizer_s_per_state_byte: float = 0.0
    """Seconds of one Adam step per byte of model state (0: unmeasured; the analytic rate is used)."""
    cpu_cores: int = 0
    """CPU cores those processes shared (on CPU; 0: not recorded, or a GPU profile)."""
    kind: str = MODEL_PROFILE_KIND
    """Record type tag."""
    schema_version: int = PROFILE_SCHEMA_VERSION
    """Version of this record's layout."""

    def __post_init__(self) -> None:
        _check_version(self.schema_version, PROFILE_SCHEMA_VERSION, "model profile")
        if self.kind != MODEL_PROFILE_KIND:
            raise ValueError(f"kind must be {MODEL_PROFILE_KIND!r}")

    def for_layer(self, layer: LayerSpec) -> Optional[LayerProfile]:
        """The measured points of this layer's shape, or None when it was not profiled. LayerSpec.rotary is
        left out of the match: profiles written before the field existed record RoPE layers without it."""
        for entry in self.layers:
            if entry.layer == layer or replace(entry.layer, rotary=layer.rotary) == layer:
                return entry
        return None


@dataclass(frozen=True)
class MeasuredCosts(CachedHash):
    """The profiles the cost model consults; either may be absent."""

    __hash__ = CachedHash.__hash__  # dataclass(frozen=True) would otherwise replace it

    cluster: Optional[ClusterProfile] = None
    """Collective curves; None keeps the analytic ring formulas."""
    model: Optional[ModelProfile] = None
    """Layer timings; None keeps the analytic GEMM-efficiency model."""


def load_profile(path: str) -> ClusterProfile | ModelProfile:
    """A cluster or model profile from JSON, told apart by its `kind` key."""
    data = serde.read_json(path, "profile")
    kind = data.get("kind") if isinstance(data, dict) else None
    types = {CLUSTER_PROFILE_KIND: ClusterProfile, MODEL_PROFILE_KIND: ModelProfile}
    if kind not in types:
        raise UserError(f"profile '{path}' has kind {kind!r}; expected one of {', '.join(types)}")
    return serde.from_dict(types[kind], data, f"profile '{Path(path).name}'")


def measured_costs(paths: list[str]) -> MeasuredCosts:
    """Combine up to one cluster profile and one model profile."""
    found: dict[str, object] = {}
    for path in paths:
        profile = load_profile(path)
        key = "cluster" if isinstance(profile, ClusterProfile) else "model"
        if key in found:
            raise UserError(f"more than one {key} profile given (--profile {path})")
        found[key] = profile
    return MeasuredCosts(**found)
