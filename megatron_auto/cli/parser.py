"""Argument parsing: the contract of docs/DESIGN.md, with one-line usage errors."""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Optional

from ..cost.fp8 import FP8_FORMATS, FP8_RECIPES
from ..kernel_choice import ATTENTION_BACKENDS, BIAS_FUSIONS, GRAD_ACCUMULATION_FUSIONS, OPTIMIZER_IMPLS
from ..megatron_flags import FSDP_SHARDING
from ..plan import RECOMPUTE_KINDS, SPACES
from ..specs.optimizer_states import MAIN_GRADS_DTYPES, MAIN_PARAMS_DTYPES, MOMENT_DTYPES
from ..specs.host_knobs import CUDA_GRAPH_IMPLS, DEFAULT_MIN_OFFLOADED_TENSOR_SIZE, OFFLOAD_MODULES
from ..specs.training import (CP_COMM_TYPES, DEFAULT_MOE_LOAD_IMBALANCE, FLEX_BACKEND_SMS, FLEX_DISPATCHER_BACKENDS,
                              MOE_TOKEN_DISPATCHERS, PRICED_ONLY_RECOMPUTE_MODULES, RECOMPUTE_MODULES)

PRECISIONS = ("bf16", "fp16", "fp32")
"""What a profile measures in."""
PRICED_PRECISIONS = (*PRECISIONS, "fp8")
"""What plan and estimate price (fp8: cost/fp8.py)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2 (`see_help`: the line ends by
    pointing at --help; Megatron-LM's pretrain_gpt.py flags, megatron_auto.train, print the bare error)."""

    def __init__(self, *args, see_help: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.see_help = see_help

    def error(self, message: str) -> NoReturn:
        hint = " (see --help)" if self.see_help else ""
        self.exit(2, f"{self.prog}: error: {message}{hint}\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def margin_fraction(text: str) -> float:
    """A safety margin: a fraction of the memory budget in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text!r}")
    return value


def load_imbalance(text: str) -> float:
    """A MoE load-imbalance factor: the busiest expert-parallel rank's routed tokens over the mean, >= 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}") from None
    if not 1.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}")
    return value


def add_moe_arguments(parser: argparse.ArgumentParser) -> None:
    """How MoE layers run (the model file says what they are): Megatron-LM's names."""
    parser.add_argument("--moe-token-dispatcher-type", choices=MOE_TOKEN_DISPATCHERS, default="alltoall",
                        help="how MoE layers send tokens to their experts (default: alltoall; flex: DeepEP's or "
                             "HybridEP's kernels, a token crossing the network once per node it reaches)")
    parser.add_argument("--moe-flex-dispatcher-backend", choices=FLEX_DISPATCHER_BACKENDS, default="deepep",
                        help="the flex dispatcher's kernels (Megatron-LM's flag; both move the same bytes)")
    parser.add_argument("--moe-deepep-num-sms", type=positive_int, default=FLEX_BACKEND_SMS["deepep"], metavar="N",
                        help="SMs DeepEP's kernels hold: what its hidden dispatch takes from the compute beside it "
                             f"(default {FLEX_BACKEND_SMS['deepep']}, Megatron-Core's)")
    parser.add_argument("--moe-hybridep-num-sms", type=positive_int, default=FLEX_BACKEND_SMS["hybridep"],
                        metavar="N", help=f"the same for HybridEP (default {FLEX_BACKEND_SMS['hybridep']})")
    parser.add_argument("--overlap-moe-expert-parallel-comm", nargs="?", const="on", default="off",
                        choices=("on", "off", "search"),
                        help="price Megatron-Core's combined 1F1B schedule: one micro-batch's dispatch and combine "
                             "beside another's compute (needs ep > 1, virtual stages when pp > 1, no full recompute); "
                             "plan's `search` weighs it and keeps it where its plan is faster")
    parser.add_argument("--delay-wgrad-compute", action="store_true",
                        help="Megatron-LM's companion of --overlap-moe-expert-parallel-comm (the weight gradients "
                             "run inside the merged step; priced the same)")
    parser.add_argument("--moe-load-imbalance", type=load_imbalance, default=DEFAULT_MOE_LOAD_IMBALANCE,
                        metavar="X", help="routed tokens on the busiest expert-parallel rank over the mean, >= 1 "
                                          f"(default {DEFAULT_MOE_LOAD_IMBALANCE}: balanced; docs/cost_model.md)")
    parser.add_argument("--moe-grouped-gemm", action="store_true",
                        help="price the experts as one grouped GEMM (Megatron's --moe-grouped-gemm)")
    parser.add_argument("--moe-shared-expert-overlap", action="store_true",
                        help="price the shared expert on its own stream beside the alltoall dispatch "
                             "(Megatron's --moe-shared-expert-overlap)")


def add_fp8_arguments(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's FP8 flags (arguments.py, _add_mixed_precision_args / transformer-engine group)."""
    parser.add_argument("--fp8-format", choices=FP8_FORMATS,
                        help="FP8 training with this format, Megatron-LM's flag (implies --precision fp8; "
                             "default with --precision fp8: hybrid)")
    parser.add_argument("--fp8-recipe", choices=FP8_RECIPES, default="delayed",
                        help="FP8 scaling recipe, Megatron-LM's names (default delayed; mxfp8 needs Blackwell)")
    parser.add_argument("--fp8-param-gather", action="store_true",
                        help="keep the linear weights in FP8 and all-gather them as such (Megatron-LM's flag)")



def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """The knobs NVIDIA's performance recipes turn, Megatron-LM's names (docs/cost_model.md, "Recipe knobs")."""
    parser.add_argument("--tp-comm-overlap", nargs="?", const="on", default="off", choices=("on", "off", "search"),
                        help="price Transformer Engine's overlap of the TP all-gathers and reduce-scatters with "
                             "the GEMMs (needs --sequence-parallel; layers with tp 1 are unaffected); `search` "
                             "(plan only): the search weighs it and keeps it where its plan is faster")
    parser.add_argument("--grad-accumulation-fusion", choices=GRAD_ACCUMULATION_FUSIONS, default="auto",
                        help="price weight gradients accumulated inside the wgrad GEMM (Megatron-LM's "
                             "--gradient-accumulation-fusion; auto: on GPU clusters, where TE, apex or the "
                             "runtime's checked stand-in runs it, off on cpu-gloo)")
    parser.add_argument("--cross-entropy-loss-fusion", action="store_true",
                        help="price Megatron-LM's fused cross entropy (with --cross-entropy-fusion-impl te, "
                             "Transformer Engine's: no fp32 softmax kept beside the logits)")
    parser.add_argument("--cross-entropy-fusion-impl", choices=("native", "te"), default="native",
                        help="which fused cross entropy (Megatron-LM's flag; default native)")
    parser.add_argument("--grad-reduce-in-bf16", action="store_true",
                        help="gradients accumulated and reduced in bf16 (2 bytes) instead of fp32, Megatron-LM's "
                             "flag (NeMo's performance recipes: grad_reduce_in_fp32=False)")
    add_optimizer_state_arguments(parser)
    parser.add_argument("--bias-fusions", choices=BIAS_FUSIONS, default="auto",
                        help="price Megatron's fused bias + activation, whose SwiGLU keeps 3f per token instead "
                             "of 4f (Megatron-LM's and NeMo's default; auto: off, as the runtime runs by default, "
                             "megatron_auto/kernel_choice.py)")
    parser.add_argument("--cp-comm-type", choices=(*CP_COMM_TYPES, "search"), default="p2p",
                        help="how Transformer Engine's attention runs context parallelism (Megatron-LM's flag): p2p "
                             "(the K/V ring), all_gather or a2a (sliding windows need a2a or all_gather); `search` "
                             "(plan only): the search weighs a2a and all_gather beside p2p and keeps the fastest; "
                             "the local spec's attention all-gathers whatever it says")
    parser.add_argument("--rope-fusion", action="store_true",
                        help="price Transformer Engine's fused RoPE, which keeps no per-layer cos/sin tables "
                             "(Megatron-LM's default where TE imports; this runtime does not run it)")


def add_optimizer_state_arguments(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's precision-aware optimizer flags (arguments.py; priced in specs/optimizer_states.py)."""
    parser.add_argument("--use-precision-aware-optimizer", nargs="?", const="on", default="off",
                        choices=("on", "off", "search"),
                        help="price Transformer Engine's FusedAdam keeping the states in the dtypes below (over "
                             "bf16 weights its fp32 masters keep only their low 16 bits); needs the distributed "
                             "optimizer, as in Megatron-Core; `search` (plan only): the search weighs it and keeps "
                             "it where its plan is faster or alone fits")
    for name, choices, what in (("main-grads", MAIN_GRADS_DTYPES, "the gradient buffer and its reduction"),
                                ("main-params", MAIN_PARAMS_DTYPES, "the master weights"),
                                ("exp-avg", MOMENT_DTYPES, "Adam's first moment"),
                                ("exp-avg-sq", MOMENT_DTYPES, "Adam's second moment")):
        parser.add_argument(f"--{name}-dtype", choices=choices, default="fp32",
                            help=f"dtype of {what} under --use-precision-aware-optimizer (default fp32)")


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


RUNTIME_NOTE = "; megatron-auto's own runtime accepts it without effect and its plans never price it"


def add_host_knob_arguments(parser: argparse.ArgumentParser) -> None:
    """CUDA graphs and fine-grained activation offloading, Megatron-LM 0.16.1's names (docs/cost_model.md, "CUDA
    graphs" and "Activation offloading")."""
    parser.add_argument("--cuda-graph-impl", choices=(*CUDA_GRAPH_IMPLS, "search"), default=None,
                        help="price CUDA graphs that replay each layer's kernels without the host's per-op time "
                             "(default none); `search` (plan only): weigh transformer_engine graphs of "
                             "--cuda-graph-scope (local for full_iteration) and keep them where the plan is faster"
                             + RUNTIME_NOTE)
    parser.add_argument("--enable-cuda-graph", action="store_true",
                        help="Megatron-LM's older spelling of --cuda-graph-impl local")
    parser.add_argument("--external-cuda-graph", action="store_true",
                        help="Megatron-LM's older spelling of --cuda-graph-impl transformer_engine")
    parser.add_argument("--cuda-graph-scope", nargs="+", metavar="SCOPE",
                        help="what the graphs capture: attn, mlp, moe, moe_router, moe_preprocess "
                             "(transformer_engine) or full_iteration (local); default (or `full`): the whole layer")
    parser.add_argument("--cuda-graph-warmup-steps", type=non_negative_int, metavar="N",
                        help="accepted as Megatron-LM takes it; the eager warm-up iterations are not priced")
    parser.add_argument("--fine-grained-activation-offloading", nargs="?", const="on", default="off",
                        choices=("on", "off", "search"),
                        help="price the saved inputs of --offload-modules sent to host memory over PCIe and "
                             "reloaded one layer ahead in backward; `search` (plan only): weigh it and keep it "
                             "where the plan is faster" + RUNTIME_NOTE)
    parser.add_argument("--offload-modules", nargs="+", choices=OFFLOAD_MODULES, metavar="MODULE",
                        help=f"the modules whose input is offloaded: {', '.join(OFFLOAD_MODULES)}")
    parser.add_argument("--min-offloaded-tensor-size", type=non_negative_int,
                        default=DEFAULT_MIN_OFFLOADED_TENSOR_SIZE, metavar="ELEMENTS",
                        help=f"saved tensors smaller than this stay on the device (default "
                             f"{DEFAULT_MIN_OFFLOADED_TENSOR_SIZE}, Megatron-LM's)")


def add_job_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """--model, --cluster, --num-nodes, --global-batch-size and the memory/precision knobs."""
    parser.add_argument("--model", required=required, metavar="PRESET|FILE.json",
                        help="model preset name or JSON file (Megatron's names suffice)")
    parser.add_argument("--cluster", required=required, metavar="PRESET|FILE.json",
                        help="cluster preset name or JSON file")
    parser.add_argument("--num-nodes", type=positive_int, metavar="N",
                        help="nodes in the job (overrides the cluster's)")
    parser.add_argument("--gpus-per-node", type=positive_int, metavar="N",
                        help="GPUs (processes) per node (overrides the cluster's)")
    parser.add_argument("--node-speeds", type=positive_float, nargs="+", metavar="S",
                        help="each node's measured speed in node-rank order, a share of the modelled one in (0, 1] "
                             "(a throttled node at 0.5): its stages are priced at that pace and the search moves "
                             "work off it")
    parser.add_argument("--global-batch-size", type=positive_int, required=required, metavar="G",
                        help="samples per iteration")
    parser.add_argument("--memory-budget-gib", type=positive_float, metavar="X",
                        help="device memory per GPU in GiB (default: the GPU's usable capacity)")
    parser.add_argument("--memory-margin", type=margin_fraction, metavar="FRACTION",
                        help="safety margin: a plan fits when its predicted device memory (allocated peak, "
                             "allocator reserve, CUDA context, NCCL) is at most budget x (1 - FRACTION) "
                             "(default: the cluster's, 0.01 on the GPU presets, 0 on cpu-gloo; docs/cost_model.md)")
    parser.add_argument("--precision", choices=PRICED_PRECISIONS,
                        help="training precision (default: fp32 on the cpu-gloo cluster, else bf16; fp8 when "
                             "--fp8-format is given): fp8 runs the decoder's linear layers in FP8 through "
                             "Transformer Engine, the rest in bf16")
    add_fp8_arguments(parser)
    add_recipe_arguments(parser)
    add_host_knob_arguments(parser)
    parser.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="auto",
                        help="core attention to price, Megatron-LM's names (auto: what the runtime runs on "
                             "that cluster: flash on GPUs, unfused on cpu-gloo)")
    parser.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS, default="auto",
                        help="optimizer step to price (auto: fused on GPUs, foreach on cpu-gloo)")
    parser.add_argument("--transformer-impl", choices=("transformer_engine", "local"),
                        help="layer spec to price, Megatron-LM's names (default: transformer_engine on GPU "
                             "clusters, Megatron-LM's default; local on cpu-gloo). Transformer Engine fuses "
                             "the norms into the next GEMM, so recomputing layernorm frees nothing there")
    parser.add_argument("--recompute-modules", nargs="+", default=None, metavar="MODULE",
                        choices=(*RECOMPUTE_MODULES, *PRICED_ONLY_RECOMPUTE_MODULES),
                        help="what selective recomputation re-runs, Megatron-LM's names: "
                             f"{', '.join(RECOMPUTE_MODULES)} (default: plan searches every set the model can run; "
                             "estimate prices core_attn); moe_act (the experts' activation, with --moe-grouped-gemm) "
                             "is priced when given, for Megatron-LM runs")
    parser.add_argument("--profile", action="append", metavar="FILE",
                        help="measured cluster and/or model profile JSON (profile-cluster, profile-model); "
                             "repeat for both. Without it the cost model is analytic")
    add_moe_arguments(parser)


def add_layout_arguments(parser: argparse.ArgumentParser, tp_pp_required: bool) -> None:
    """Megatron's parallelism flags: --tp, --pp, --dp, micro-batch, virtual stages, recompute."""
    parser.add_argument("--tp", type=positive_int, required=tp_pp_required, metavar="T",
                        help="tensor-parallel degree")
    parser.add_argument("--pp", type=positive_int, required=tp_pp_required, metavar="P",
                        help="pipeline-parallel degree")
    parser.add_argument("--dp", type=positive_int, metavar="D",
                        help="data-parallel degree; must equal world / (tp x pp)")
    parser.add_argument("--micro-batch-size", type=positive_int, metavar="M",
                        help="samples per micro-batch per data-parallel rank (default: the best)")
    parser.add_argument("--virtual-stages", type=positive_int, metavar="V",
                        help="chunks per pipeline stage (default: the best)")
    parser.add_argument("--recompute", choices=RECOMPUTE_KINDS,
                        help="activation recomputation of every layer")
    parser.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                        help="Megatron sequence parallelism (needs tp > 1)")
    parser.add_argument("--distributed-optimizer", action=argparse.BooleanOptionalAction, default=None,
                        help="Megatron's distributed optimizer (ZeRO-1)")
    parser.add_argument("--ep", "--expert-model-parallel-size", dest="ep", type=positive_int, metavar="E",
                        help="expert-parallel degree of the MoE layers")
    parser.add_argument("--etp", "--expert-tensor-parallel-size", dest="etp", type=positive_int, metavar="T",
                        help="expert tensor-parallel degree of the MoE layers (default: tp)")
    parser.add_argument("--cp", "--context-parallel-size", dest="cp", type=positive_int, metavar="C",
                        help="context-parallel degree: each sequence split over C ranks (dense models on flash "
                             "attention)")


def add_split_arguments(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's flags for the pipeline split, spelled as Megatron-LM spells them."""
    for end in ("first", "last"):
        parser.add_argument(f"--decoder-{end}-pipeline-num-layers", type=positive_int, metavar="N",
                            help=f"decoder layers of the {end} pipeline stage; the others split the rest evenly")
    for part in ("embedding", "loss"):
        parser.add_argument(f"--account-for-{part}-in-pipeline-split", action="store_const", const=True,
                            help=f"count the {part} as one layer of an even split (its chunk holds one layer fewer)")
    parser.add_argument("--pipeline-model-parallel-layout", metavar="LAYOUT",
                        help="the layers of every chunk, as Megatron-LM spells it (e.g. \"Et*3|t*4|t*4|t*3L\"); "
                             "fixes the virtual stages")


def add_sharding_arguments(parser: argparse.ArgumentParser) -> None:
    """Megatron-FSDP and partial recomputation, as Megatron-LM spells them (estimate prices them)."""
    add_fsdp_arguments(parser)
    parser.add_argument("--recompute-num-layers", type=positive_int, metavar="N",
                        help="with --recompute full: recompute the first N layers of every chunk "
                             "(Megatron-LM's block method)")


def add_fsdp_arguments(parser: argparse.ArgumentParser) -> None:
    """--use-megatron-fsdp and its sharding strategy (estimate prices them; plan searches under them)."""
    parser.add_argument("--use-megatron-fsdp", action="store_const", const=True,
                        help="Megatron-FSDP: shard what --data-parallel-sharding-strategy says over the "
                             "data-parallel ranks")
    parser.add_argument("--data-parallel-sharding-strategy", choices=tuple(FSDP_SHARDING.values()),
                        default="optim_grads_params",
                        help="with --use-megatron-fsdp: no_shard, optim (ZeRO-1), optim_grads (ZeRO-2) or "
                             "optim_grads_params (ZeRO-3, the default)")


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--out", metavar="plan.json", help="write the plan to this file")


def _plan_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("plan", allow_abbrev=False, help="search for the fastest plan that fits",
                                 description="Search for the fastest plan that fits in memory.")
    add_job_arguments(parser)
    parser.add_argument("--space", choices=SPACES, default="megatron",
                        help="megatron: what stock Megatron-Core runs; hybrid: per-layer layouts")
    add_layout_arguments(parser, tp_pp_required=False)
    add_fsdp_arguments(parser)
    add_output_arguments(parser)
    parser.add_argument("--verbose", action="store_true", help="log the search's progress and pruning")


def _estimate_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "estimate", allow_abbrev=False, help="predict the time and memory of given flags or a plan file",
        description="Predict time and memory of Megatron flags (--tp/--pp/...) or of a plan file (--plan).")
    parser.add_argument("--plan", metavar="FILE", help="score this plan file instead of --tp/--pp flags")
    add_job_arguments(parser, required=False)
    add_layout_arguments(parser, tp_pp_required=False)
    add_split_arguments(parser)
    add_sharding_arguments(parser)
    add_output_arguments(parser)


def _show_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("show", allow_abbrev=False, help="print a plan file as a table",
                                 description="Print a plan file as a human-readable table.")
    parser.add_argument("plan", metavar="plan.json", help="plan file")
    parser.add_argument("--json", action="store_true", help="print the plan's canonical JSON instead")
    parser.add_argument("--png", metavar="FILE", help="also draw the plan to this PNG file (needs matplotlib)")
    parser.add_argument("--cluster", metavar="PRESET|FILE.json",
                        help="the mixed cluster the plan was made for, whose node groups to name and draw "
                             "(default: the preset the plan names)")
    parser.add_argument("--node-speeds", type=positive_float, nargs="+", metavar="S",
                        help="the --node-speeds the plan was made with")


def _profile_parsers(commands: argparse._SubParsersAction) -> None:
    cluster = commands.add_parser("profile-cluster", allow_abbrev=False, help="measure collectives (under torchrun)",
                                  description="Measure collective bandwidth and latency; run under torchrun.")
    cluster.add_argument("--out", default="cluster_profile.json", metavar="FILE", help="profile JSON to write")
    cluster.add_argument("--name", default="measured", help="label for the profile")
    cluster.add_argument("--min-bytes", type=positive_int, default=4096, metavar="B")
    cluster.add_argument("--max-bytes", type=positive_int, default=16 * 1024**2, metavar="B")
    cluster.add_argument("--size-factor", type=positive_int, default=4, metavar="K", help="ratio between sizes")
    cluster.add_argument("--iters", type=positive_int, default=5, help="timed calls per point (median)")
    model = commands.add_parser("profile-model", allow_abbrev=False, help="measure layer times (under torchrun)",
                                description="Time Megatron-Core layers at TP-sharded shapes; run under torchrun "
                                            "with as many processes per node as the job has ranks.")
    model.add_argument("--model", required=True, metavar="PRESET|FILE.json")
    model.add_argument("--out", default="model_profile.json", metavar="FILE", help="profile JSON to write")
    model.add_argument("--tp", type=positive_int, nargs="+", default=[1, 2, 4], metavar="T")
    model.add_argument("--micro-batch-size", type=positive_int, nargs="+", default=[1, 2, 4], metavar="B")
    model.add_argument("--seq-length", type=positive_int, nargs="+", metavar="S",
                       help="sequence lengths (default: the model's)")
    model.add_argument("--precision", choices=PRECISIONS, default="fp32")
    model.add_argument("--iters", type=positive_int, default=5, help="timed calls per point (median)")
    model.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="auto",
                       help="core attention to measure, resolved as tools/pretrain_gpt.py resolves it "
                            "(auto: flash on GPUs, unfused on CPU)")
    model.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS, default="auto",
                       help="Adam step to measure (auto: fused on GPUs, foreach on CPU)")
    model.add_argument("--rotary-percent", type=positive_float, default=1.0, metavar="F",
                       help="share of each head's channels that RoPE rotates, as tools/pretrain_gpt.py's flag")
    model.add_argument("--bias-fusions", choices=BIAS_FUSIONS, default="auto",
                       help="Megatron's bias fusions in the measured layer, as tools/pretrain_gpt.py's flag")
    model.add_argument("--grad-accumulation-fusion", choices=GRAD_ACCUMULATION_FUSIONS, default="auto",
                       help="weight gradients added into fp32 main_grad by the GEMM, as tools/pretrain_gpt.py's flag")


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="megatron-auto", allow_abbrev=False,
                           description="Automatic hybrid parallelism for Megatron-Core.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="{plan,estimate,show,profile-cluster,profile-model}", required=True,
                                     parser_class=OneLineParser)
    _plan_parser(commands)
    _estimate_parser(commands)
    _show_parser(commands)
    _profile_parsers(commands)
    return parser


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    return build_parser().parse_args(sys.argv[1:] if argv is None else argv)


def _version() -> str:
    from .. import __version__

    return __version__
