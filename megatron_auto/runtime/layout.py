"""The Megatron-Core layout of a `megatron`-space plan, read off its Megatron-LM flags.

`megatron_auto.megatron_flags` is the one mapping from a Plan to Megatron's
parallelism flags; the runtime parses those flags back instead of re-deriving
them, so `--auto-parallel` and the same plan typed as manual flags give the same
Megatron-Core configuration by construction. No torch here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import UserError
from ..megatron_flags import flag_groups, megatron_flags
from ..parallel_dims import ParallelDims
from ..pipeline_layout import runtime_chunk_problem, runtime_mtp_problem
from ..plan import Plan


@dataclass(frozen=True)
class MegatronLayout:
    """Megatron-Core's settings for one run: its parallel degrees, its batch and how its layers split."""

    dims: ParallelDims
    """tp, cp, dp, pp, vp, ep, etp (parallel_dims.py)."""
    micro_batch_size: int
    """Samples per micro-batch per data-parallel replica."""
    num_micro_batches: int
    global_batch_size: int
    first_stage_layers: Optional[int] = None
    last_stage_layers: Optional[int] = None
    account_for_embedding: bool = False
    """Megatron's account_for_embedding_in_pipeline_split: the first chunk holds one layer fewer."""
    account_for_loss: bool = False
    """Megatron's account_for_loss_in_pipeline_split: the last chunk holds one layer fewer."""
    pipeline_layout: Optional[str] = None
    """Megatron's pipeline_model_parallel_layout (--pipeline-model-parallel-layout): every chunk's layers."""
    recompute_granularity: Optional[str] = None
    """None, selective or full."""
    recompute_method: Optional[str] = None
    """uniform or block (full recomputation only)."""
    recompute_num_layers: Optional[int] = None
    sequence_parallel: bool = False
    distributed_optimizer: bool = False


def _parse_flags(flags: list[str]) -> dict[str, object]:
    """`--name value` pairs, bare `--switch`es and `--name v1 v2` lists into a dict keyed by the flag's Python
    name."""
    values: dict[str, object] = {}
    for flag, *given in flag_groups(flags):
        values[flag.lstrip("-").replace("-", "_")] = True if not given else given[0] if len(given) == 1 else given
    return values


def expert_layout(plan: Plan) -> tuple[int, Optional[int]]:
    """(ep, etp) of the plan's MoE layers, which a megatron-space plan gives all one value; (1, None)
    for a dense model. Without the model in the plan, the layers whose ep or etp is set."""
    strategies = plan.layer_strategies
    if plan.model is not None:
        strategies = tuple(s for layer, s in zip(plan.model.layers, strategies) if layer.moe is not None)
    experts = {(s.ep, s.etp) for s in strategies if s.ep > 1 or s.etp is not None}
    if len(experts) > 1:
        raise UserError(f"the Megatron-Core runtime runs one ep/etp for all MoE layers; the plan has {sorted(experts)}")
    return next(iter(experts), (1, None))


def layout_from_plan(plan: Plan) -> MegatronLayout:
    """The Megatron layout of a megatron-space plan; UserError for a hybrid plan."""
    if plan.space != "megatron":
        raise UserError(f"the Megatron-Core runtime runs megatron-space plans; this plan is {plan.space!r}")
    problem = runtime_mtp_problem(plan.mtp_chunk) or runtime_chunk_problem(
        tuple(len(chunk.layers) for chunk in plan.chunks))
    if problem:
        raise UserError(f"this plan's {problem}")
    flags = _parse_flags(megatron_flags(plan))
    if flags.get("use_megatron_fsdp"):
        raise UserError(f"Megatron-FSDP (--data-parallel-sharding-strategy {flags['data_parallel_sharding_strategy']}) "
                        "is priced by plan and estimate, not run here; ZeRO-3 layers run from --auto-parallel-space "
                        "hybrid")

    def number(name: str) -> Optional[int]:
        return int(flags[name]) if name in flags else None

    per_virtual_stage = number("num_layers_per_virtual_pipeline_stage")
    pipeline_layout = flags.get("pipeline_model_parallel_layout")
    ep, etp = expert_layout(plan)
    dims = ParallelDims(tp=int(flags["tensor_model_parallel_size"]), cp=plan.embedding.cp, dp=plan.embedding.dp,
                        pp=int(flags["pipeline_model_parallel_size"]),
                        vp=plan.virtual_stages if per_virtual_stage or pipeline_layout else 1, ep=ep, etp=etp)
    return MegatronLayout(
        dims=dims,
        micro_batch_size=int(flags["micro_batch_size"]),
        num_micro_batches=plan.num_micro_batches,
        global_batch_size=int(flags["global_batch_size"]),
        first_stage_layers=number("decoder_first_pipeline_num_layers"),
        last_stage_layers=number("decoder_last_pipeline_num_layers"),
        account_for_embedding=bool(flags.get("account_for_embedding_in_pipeline_split", False)),
        account_for_loss=bool(flags.get("account_for_loss_in_pipeline_split", False)),
        pipeline_layout=pipeline_layout,  # type: ignore[arg-type]
        recompute_granularity=flags.get("recompute_granularity"),  # type: ignore[arg-type]
        recompute_method=flags.get("recompute_method"),  # type: ignore[arg-type]
        recompute_num_layers=number("recompute_num_layers"),
        sequence_parallel=bool(flags.get("sequence_parallel", False)),
        distributed_optimizer=bool(flags.get("use_distributed_optimizer", False)),
    )
