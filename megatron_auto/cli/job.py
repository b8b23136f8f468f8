"""Turning command-line arguments into the model, cluster and training specs."""
from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from typing import Optional

from ..errors import UserError
from ..kernel_choice import resolve_attention_backend, resolve_bias_fusions, resolve_optimizer_impl
from ..specs import ClusterSpec, ModelSpec, TrainingSpec, load_cluster, load_model
from ..specs.presets import with_measured_speeds, with_node_speeds
from ..specs.host_knobs import DEFAULT_MIN_OFFLOADED_TENSOR_SIZE
from ..specs.optimizer_states import OptimizerStates
from ..specs.training import (DEFAULT_MOE_LOAD_IMBALANCE, DEFAULT_RECOMPUTE_MODULES, FLEX_BACKEND_SMS, GIB,
                              recompute_modules_problem)

CPU_CLUSTER_PRESET = "cpu-gloo"
logger = logging.getLogger(__name__)


def load_cluster_arg(name: str, num_nodes: Optional[int], gpus_per_node: Optional[int]) -> ClusterSpec:
    """The cluster, with --num-nodes and --gpus-per-node applied."""
    cluster = load_cluster(name, num_nodes)
    if cluster.is_mixed and gpus_per_node not in (None, cluster.common_node_gpus, cluster.gpus_per_node):
        raise UserError(f"--gpus-per-node {gpus_per_node}: mixed cluster '{cluster.name}' has "
                        f"{cluster.node_shape()} in its groups; leave --gpus-per-node out")
    if cluster.is_mixed:
        return cluster
    if gpus_per_node is not None:
        try:
            cluster = replace(cluster, gpus_per_node=gpus_per_node)
        except ValueError as error:
            raise UserError(f"--gpus-per-node {gpus_per_node}: {error}") from None
    return cluster


def attach_profiles(cluster: ClusterSpec, args: argparse.Namespace) -> ClusterSpec:
    """--profile FILE...: the measured profiles the cost model then uses instead of the analytic terms."""
    paths = getattr(args, "profile", None)
    if not paths:
        return cluster
    from ..specs.profiles import measured_costs

    return replace(cluster, measured=measured_costs(paths))


def fit_cluster_to_world(cluster: ClusterSpec, world_size: int, args: argparse.Namespace) -> ClusterSpec:
    """For scoring a plan: size the cluster to the plan's GPUs unless the user fixed the size."""
    if args.num_nodes is not None or cluster.is_mixed:  # a mixed cluster keeps its groups' nodes
        return cluster
    per_node = cluster.gpus_per_node
    if world_size % per_node == 0:
        return replace(cluster, num_nodes=world_size // per_node)
    if world_size < per_node and args.gpus_per_node is None:
        return replace(cluster, num_nodes=1, gpus_per_node=world_size)
    raise UserError(f"the plan's {world_size} GPUs do not fill whole nodes of {per_node}; "
                    f"give --num-nodes and --gpus-per-node")


def training_spec(args: argparse.Namespace, cluster_name: str, global_batch_size: int) -> TrainingSpec:
    """Batch, precision, memory budget and margin, and kernels; fp32 and the CPU's kernels are the defaults on
    the CPU cluster."""
    on_gpu = cluster_name != CPU_CLUSTER_PRESET
    precision = precision_of(args, on_gpu)
    budget = max(1, int(args.memory_budget_gib * GIB)) if args.memory_budget_gib else 0  # 0 would mean "all"
    kernels = dict(attention_backend=resolve_attention_backend(getattr(args, "attention_backend", "auto"), on_gpu),
                   optimizer_impl=resolve_optimizer_impl(getattr(args, "optimizer_impl", "auto"), on_gpu),
                   memory_margin=getattr(args, "memory_margin", None),
                   recompute_modules=tuple(getattr(args, "recompute_modules", None) or DEFAULT_RECOMPUTE_MODULES),
                   fused_norms=(getattr(args, "transformer_impl", None) or
                                ("transformer_engine" if on_gpu else "local")) == "transformer_engine")
    moe = dict(moe_token_dispatcher=getattr(args, "moe_token_dispatcher_type", "alltoall"),
               moe_load_imbalance=getattr(args, "moe_load_imbalance", DEFAULT_MOE_LOAD_IMBALANCE),
               moe_grouped_gemm=getattr(args, "moe_grouped_gemm", False),
               moe_shared_expert_overlap=getattr(args, "moe_shared_expert_overlap", False),
               moe_flex_backend=getattr(args, "moe_flex_dispatcher_backend", "deepep"),
               moe_deepep_num_sms=getattr(args, "moe_deepep_num_sms", None) or FLEX_BACKEND_SMS["deepep"],
               moe_hybridep_num_sms=getattr(args, "moe_hybridep_num_sms", None) or FLEX_BACKEND_SMS["hybridep"],
               moe_ep_overlap=_ep_overlap_flag(args))
    try:
        spec = TrainingSpec.for_precision(precision, global_batch_size, memory_budget_bytes=budget, **kernels, **moe,
                                          **fp8_options(args, precision), **recipe_options(args, precision, on_gpu))
        if ep_overlap_arg(args) == "search":
            # Built and dropped: TrainingSpec's checks refuse now, not mid-search, what Megatron-Core refuses beside it.
            replace(spec, moe_ep_overlap=True)
        if cp_comm_type_arg(args) == "search" and not spec.fused_norms:
            raise UserError("--cp-comm-type search weighs Transformer Engine's CP attention; the local spec's "
                            "(--transformer-impl local) all-gathers K and V whatever the type")
        return spec
    except ValueError as error:
        raise UserError(str(error)) from None


def ep_overlap_arg(args: argparse.Namespace) -> str:
    """--overlap-moe-expert-parallel-comm: on, off or search."""
    return getattr(args, "overlap_moe_expert_parallel_comm", "off")


def _ep_overlap_flag(args: argparse.Namespace) -> bool:
    """--overlap-moe-expert-parallel-comm on (`search` leaves it to knob_switches); --delay-wgrad-compute alone is
    refused, as Megatron-Core refuses it."""
    choice = ep_overlap_arg(args)
    if getattr(args, "delay_wgrad_compute", False) and choice == "off":
        raise UserError("--delay-wgrad-compute needs --overlap-moe-expert-parallel-comm (as in Megatron-Core)")
    return choice == "on"


def precision_of(args: argparse.Namespace, on_gpu: bool) -> str:
    """--precision, or fp8 where --fp8-format asks for it (as Megatron-LM's flag turns FP8 on)."""
    fp8_format = getattr(args, "fp8_format", None)
    if fp8_format and args.precision not in (None, "fp8"):
        raise UserError(f"--fp8-format {fp8_format} asks for FP8 training, not --precision {args.precision}")
    if fp8_format:
        return "fp8"
    return args.precision or ("bf16" if on_gpu else "fp32")


def fp8_options(args: argparse.Namespace, precision: str) -> dict:
    """TrainingSpec's fp8 fields from Megatron-LM's flags (only under fp8: they mean nothing otherwise)."""
    if precision != "fp8":
        if getattr(args, "fp8_param_gather", False):
            raise UserError("--fp8-param-gather needs FP8 training (--precision fp8 or --fp8-format)")
        return {}
    return dict(fp8_format=getattr(args, "fp8_format", None) or "hybrid",
                fp8_recipe=getattr(args, "fp8_recipe", "delayed"),
                fp8_param_gather=getattr(args, "fp8_param_gather", False))


def recipe_options(args: argparse.Namespace, precision: str, on_gpu: bool) -> dict:
    """--tp-comm-overlap, --grad-reduce-in-bf16 and the kernel fusions as TrainingSpec fields."""
    fusion, cp_kind = getattr(args, "grad_accumulation_fusion", "auto"), cp_comm_type_arg(args)
    options = dict(tp_comm_overlap=getattr(args, "tp_comm_overlap", "off") in ("on", True),
                   grad_accumulation_fusion=fusion == "on" or (fusion == "auto" and on_gpu),
                   bias_activation_fusion=resolve_bias_fusions(getattr(args, "bias_fusions", "auto"), on_gpu),
                   rope_fusion=bool(getattr(args, "rope_fusion", False)),
                   cross_entropy_fusion=(getattr(args, "cross_entropy_fusion_impl", "native")
                                         if getattr(args, "cross_entropy_loss_fusion", False) else "none"),
                   cp_comm_type="p2p" if cp_kind == "search" else cp_kind)
    if getattr(args, "grad_reduce_in_bf16", False):
        if precision == "fp32":
            raise UserError("--grad-reduce-in-bf16 needs 16-bit or fp8 training, not fp32")
        options["grad_bytes"] = 2
    return {**options, **host_knob_options(args), "optimizer_states": optimizer_states_arg(args)}


def cp_comm_type_arg(args: argparse.Namespace) -> str:
    """--cp-comm-type: p2p, all_gather, a2a or search."""
    return getattr(args, "cp_comm_type", "p2p")


def precision_aware_arg(args: argparse.Namespace) -> str:
    """--use-precision-aware-optimizer: on, off or search."""
    return getattr(args, "use_precision_aware_optimizer", "off")


def optimizer_states_arg(args: argparse.Namespace, switched: bool = False) -> OptimizerStates:
    """--use-precision-aware-optimizer and its four dtype flags (checked by TrainingSpec, as Megatron-Core does);
    under `search` the spec keeps fp32 states and the switch (`switched`) carries these."""
    choice = precision_aware_arg(args)
    if choice == "search" and not switched:
        return OptimizerStates()
    return OptimizerStates(precision_aware=choice != "off",
                           **{f"{name}_dtype": getattr(args, f"{name}_dtype", "fp32")
                              for name in ("main_grads", "main_params", "exp_avg", "exp_avg_sq")})


def distributed_optimizer_arg(args: argparse.Namespace) -> Optional[bool]:
    """--distributed-optimizer as given, or True where the precision-aware optimizer needs it (Megatron-Core's
    optimizer_config.py; under `search` the search pins it with the switch); refused beside
    --no-distributed-optimizer or Megatron-FSDP."""
    given, choice = args.distributed_optimizer, precision_aware_arg(args)
    if choice == "off":
        return given
    if given is False or getattr(args, "use_megatron_fsdp", None):
        raise UserError("--use-precision-aware-optimizer needs the distributed optimizer (--distributed-optimizer), "
                        "not " + ("--no-distributed-optimizer" if given is False else "--use-megatron-fsdp")
                        + " (as in Megatron-Core)")
    return True if choice == "on" else given


def host_knob_options(args: argparse.Namespace) -> dict:
    """CUDA graphs and fine-grained activation offloading as TrainingSpec fields, as Megatron-LM 0.16.1 reads its
    flags (arguments.py: --enable-cuda-graph is local, --external-cuda-graph transformer_engine; `full` alone is the
    whole layer); a `search` value leaves its knob off here (knob_switches)."""
    impl = cuda_graph_impl_arg(args)
    offload = getattr(args, "fine_grained_activation_offloading", "off")
    modules = offload_modules_arg(args) if offload == "on" else ()
    return dict(cuda_graph_impl=impl if impl != "search" else "none",
                cuda_graph_scope=cuda_graph_scope_arg(args) if impl not in ("none", "search") else (),
                offload_modules=modules,
                min_offloaded_tensor_size=getattr(args, "min_offloaded_tensor_size", DEFAULT_MIN_OFFLOADED_TENSOR_SIZE))


def knob_switches(args: argparse.Namespace) -> tuple[dict, ...]:
    """The TrainingSpec fields `plan` weighs turning on (`search` values): CUDA graphs of --cuda-graph-scope
    (transformer_engine's, or local's for full_iteration), then offloading of --offload-modules, then the
    precision-aware optimizer with the dtypes given, then the EP overlap (Megatron-Core's combined 1F1B), then
    Transformer Engine's a2a and all_gather CP attention in place of its ring."""
    switches = []
    if cuda_graph_impl_arg(args) == "search":
        scope = cuda_graph_scope_arg(args)
        switches.append(dict(cuda_graph_impl="local" if scope == ("full_iteration",) else "transformer_engine",
                             cuda_graph_scope=scope))
    if getattr(args, "fine_grained_activation_offloading", "off") == "search":
        switches.append(dict(offload_modules=offload_modules_arg(args),
                             min_offloaded_tensor_size=args.min_offloaded_tensor_size))
    if precision_aware_arg(args) == "search":
        switches.append(dict(optimizer_states=optimizer_states_arg(args, switched=True)))
    if ep_overlap_arg(args) == "search":
        switches.append(dict(moe_ep_overlap=True))
    if cp_comm_type_arg(args) == "search":
        switches += [dict(cp_comm_type="a2a"), dict(cp_comm_type="all_gather")]
    return tuple(switches)


def cuda_graph_impl_arg(args: argparse.Namespace) -> str:
    """--cuda-graph-impl, or what --enable-cuda-graph / --external-cuda-graph stand for (refused beside it)."""
    impl = getattr(args, "cuda_graph_impl", None)
    older = [flag for flag, on in (("--enable-cuda-graph", getattr(args, "enable_cuda_graph", False)),
                                   ("--external-cuda-graph", getattr(args, "external_cuda_graph", False))) if on]
    if len(older) > 1:
        raise UserError("--enable-cuda-graph and --external-cuda-graph cannot be given together (as in Megatron-LM)")
    if older and impl not in (None, "none"):
        raise UserError(f"do not give {older[0]} with --cuda-graph-impl (as in Megatron-LM)")
    if older:
        return "local" if older[0] == "--enable-cuda-graph" else "transformer_engine"
    return impl or "none"


def graph_recompute_problem(args: argparse.Namespace) -> Optional[str]:
    """Why --recompute full cannot run beside the CUDA graphs asked for, or None (Megatron-Core's
    transformer_config.py: full recompute only under a full_iteration graph)."""
    if args.recompute != "full" or cuda_graph_impl_arg(args) in ("none", "search"):
        return None
    if "full_iteration" in (getattr(args, "cuda_graph_scope", None) or ()):
        return None
    return "--recompute full runs CUDA graphs only with --cuda-graph-scope full_iteration (as in Megatron-Core)"


def cuda_graph_scope_arg(args: argparse.Namespace) -> tuple[str, ...]:
    scope = tuple(getattr(args, "cuda_graph_scope", None) or ())
    if "full" in scope and scope != ("full",):
        raise UserError("--cuda-graph-scope full (the whole layer) cannot be given with other scopes")
    return () if scope == ("full",) else scope


def offload_modules_arg(args: argparse.Namespace) -> tuple[str, ...]:
    modules = tuple(getattr(args, "offload_modules", None) or ())
    if not modules:
        raise UserError("--fine-grained-activation-offloading needs --offload-modules (as in Megatron-Core)")
    return modules


def sequence_parallel_flag(args: argparse.Namespace) -> Optional[bool]:
    """--sequence-parallel, turned off with a warning at --tp 1, as Megatron-LM's arguments.py does."""
    if args.sequence_parallel and args.tp == 1:
        logger.warning("warning: disabling --sequence-parallel because --tp is 1 (as Megatron-LM does)")
        return False
    return args.sequence_parallel


def with_speeds(cluster: ClusterSpec, args: argparse.Namespace) -> ClusterSpec:
    """`cluster` with the user's --node-speeds, which stand in for any its profile measured, else the measured."""
    if not getattr(args, "node_speeds", None):
        return with_measured_speeds(cluster)
    try:
        return with_node_speeds(cluster, tuple(args.node_speeds))
    except ValueError as error:
        raise UserError(f"--node-speeds: {error}") from None


def load_job(args: argparse.Namespace) -> tuple[ModelSpec, ClusterSpec, TrainingSpec]:
    """--model, --cluster (+ --num-nodes/--gpus-per-node), --global-batch-size and friends."""
    for flag, value in (("--model", args.model), ("--cluster", args.cluster),
                        ("--global-batch-size", args.global_batch_size)):
        if value is None:
            raise UserError(f"{flag} is required")
    model = load_model(args.model)
    cluster = with_speeds(attach_profiles(load_cluster_arg(args.cluster, args.num_nodes, args.gpus_per_node), args),
                          args)
    training = training_spec(args, cluster.name, args.global_batch_size)
    switches = knob_switches(args)
    problem = recompute_modules_problem(model.layers, training.recompute_modules) or offload_job_problem(
        cluster, training, switches)
    if problem:
        raise UserError(problem)
    try:  # what plan may turn on must run beside the rest
        replace(training, **{key: value for switch in switches for key, value in switch.items()})
    except ValueError as error:
        raise UserError(str(error)) from None
    return model, cluster, training


def offload_job_problem(cluster: ClusterSpec, training: TrainingSpec, switches: tuple[dict, ...]) -> Optional[str]:
    """Why this job cannot offload activations, or None: Megatron-LM runs offloading with Transformer Engine's
    layers only (arguments.py), and pricing it needs the GPU's host link."""
    if not training.offload_modules and not any("offload_modules" in switch for switch in switches):
        return None
    if not training.fused_norms:
        return "--fine-grained-activation-offloading runs with --transformer-impl transformer_engine only"
    if cluster.gpu.host_link_bytes_per_s <= 0:
        return (f"--fine-grained-activation-offloading: cluster '{cluster.name}' gives its GPU no host link "
                "bandwidth (gpu.host_link_bytes_per_s)")
    return None
