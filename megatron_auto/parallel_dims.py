"""The parallel degrees of a run: one record, one naming scheme, one check of how they fit a world.

Megatron-Core lays its ranks out in the order tp-cp-ep-dp-pp (parallel_state.initialize_model_parallel,
order="tp-cp-ep-dp-pp"): a pipeline stage holds tp x cp x dp ranks, and the expert groups partition those
same ranks as etp x ep x expert-dp (its expert RankGenerator). torchtitan's ParallelDims is the model for
keeping the degrees in one record with one validation.

Every record that carries degrees names them as here (tp, cp, dp, pp, vp, ep, etp): MegatronLayout holds a
ParallelDims; ManualParallelism, UniformConfig and SearchConstraints hold the degrees the user or the search
chose and derive theirs with `ParallelDims.for_world`; LayerStrategy, one layer's layout on its stage,
checks its degrees with `check_stage_degrees`. Megatron-LM's long flag names (--tensor-model-parallel-size)
live only at the command line, and the plan file keeps its own keys (`pipeline_parallel`, `virtual_stages`)
so that plan files already written still load. Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .errors import UserError


def check_positive(**degrees: int) -> None:
    """ValueError unless every degree is an integer of at least 1."""
    for name, degree in degrees.items():
        if not isinstance(degree, int) or degree < 1:
            raise ValueError(f"{name} must be an integer of at least 1, got {degree!r}")


def check_stage_degrees(tp: int, cp: int, dp: int, ep: int = 1, etp: Optional[int] = None) -> None:
    """ValueError unless the degrees of one pipeline stage can form Megatron-Core's groups: every degree a
    positive integer, and ep x etp (etp None: tp) dividing tp x cp x dp, which the expert groups partition."""
    check_positive(tp=tp, cp=cp, dp=dp, ep=ep, etp=1 if etp is None else etp)
    expert_tp = tp if etp is None else etp
    if (tp * cp * dp) % (ep * expert_tp):
        raise ValueError(f"ep x etp = {ep} x {expert_tp} does not divide tp x cp x dp = {tp * cp * dp}")


@dataclass(frozen=True)
class ParallelDims:
    """How a run's ranks split: world = tp x cp x dp x pp, in Megatron-Core's rank order."""

    tp: int = 1
    """Tensor-parallel degree [--tensor-model-parallel-size]."""
    cp: int = 1
    """Context-parallel degree [--context-parallel-size]: each sequence split over cp ranks."""
    dp: int = 1
    """Data-parallel degree: what the world leaves after tp x cp x pp."""
    pp: int = 1
    """Pipeline-parallel degree [--pipeline-model-parallel-size]."""
    vp: int = 1
    """Model chunks per pipeline stage (Megatron's virtual pipeline size)."""
    ep: int = 1
    """Expert-parallel degree of the MoE layers [--expert-model-parallel-size]."""
    etp: Optional[int] = None
    """Expert tensor-parallel degree [--expert-tensor-parallel-size]; None: tp (Megatron's default)."""

    def __post_init__(self) -> None:
        check_stage_degrees(self.tp, self.cp, self.dp, self.ep, self.etp)
        check_positive(pp=self.pp, vp=self.vp)
        if self.vp > 1 and self.pp < 2:
            raise ValueError(f"vp = {self.vp} model chunks per stage need pp of 2 or more (the interleaved schedule)")

    @classmethod
    def for_world(cls, world_size: int, *, tp: int = 1, cp: int = 1, pp: int = 1, vp: int = 1, ep: int = 1,
                  etp: Optional[int] = None, dp: Optional[int] = None) -> "ParallelDims":
        """The degrees on `world_size` ranks, dp what the world leaves (or checked against it when given);
        UserError, in one line, when they do not fit."""
        try:
            check_positive(tp=tp, cp=cp, pp=pp, vp=vp, ep=ep, etp=1 if etp is None else etp)
        except ValueError as error:
            raise UserError(f"the parallel degrees do not fit: {error}") from None
        model_parallel = tp * cp * pp
        named = " x ".join(f"{name} {degree}" for name, degree in (("TP", tp), ("CP", cp), ("PP", pp))
                           if degree > 1 or name != "CP")
        if world_size % model_parallel:
            raise UserError(f"world size {world_size} is not divisible by {named} = {model_parallel}")
        if dp is not None and dp != world_size // model_parallel:
            raise UserError(f"--dp {dp} does not match the world size: {world_size} GPUs / ({named}) = "
                            f"{world_size // model_parallel}")
        dp = world_size // model_parallel
        if (tp * cp * dp) % (ep * (etp or tp)):
            named_stage, sizes = ("TP x CP x DP", f"{tp} x {cp} x {dp}") if cp > 1 else ("TP x DP", f"{tp} x {dp}")
            raise UserError(f"world size {world_size} does not fit expert parallelism: EP x expert TP = {ep} x "
                            f"{etp or tp} must divide {named_stage} = {sizes}")
        try:
            return cls(tp=tp, cp=cp, dp=dp, pp=pp, vp=vp, ep=ep, etp=etp)
        except ValueError as error:
            raise UserError(f"the parallel degrees do not fit: {error}") from None

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def stage_gpus(self) -> int:
        """Ranks of one pipeline stage: tp x cp x dp."""
        return self.tp * self.cp * self.dp

    @property
    def gradient_dp(self) -> int:
        """Ranks that hold the same weights and reduce their gradients together: dp x cp (Megatron-Core's
        data-parallel group with context parallelism; the distributed optimizer shards over it too)."""
        return self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel degree of the experts: etp, or tp when unset."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Data-parallel degree of the experts: tp x cp x dp / (ep x etp) (Megatron-Core's expert data-parallel
        group)."""
        return self.stage_gpus // (self.ep * self.expert_tp)

    def micro_batches(self, global_batch: int, micro_batch: int) -> int:
        """Micro-batches per step on each data-parallel replica; UserError unless micro-batch x DP divides the
        global batch (Megatron's check in its microbatch calculator)."""
        unit = micro_batch * self.dp
        if micro_batch < 1 or global_batch < 1 or global_batch % unit:
            raise UserError(f"global batch {global_batch} is not divisible by micro batch x DP = {unit} "
                            f"({micro_batch} x {self.dp})")
        return global_batch // unit

