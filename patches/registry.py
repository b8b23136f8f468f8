"""The table of megatron-core patches: one frozen record per patch, read by apply_all, the tests and the README.

Each patch module still says in its docstring why it exists, which versions it targets and when it can go;
this table says what kind of patch it is and where it applies, in one place. tests/runtime/test_patches.py
checks the table against the modules (every patch file has a row, every row a file, the same versions and
removal condition) and the README's patch section against the table; `python -m patches` rewrites that
section.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from megatron_auto.markdown_sections import marked_section, replace_marked_section

KINDS = {
    "cpu-gloo": "lets megatron-core run on CPU with gloo; a no-op where CUDA is present",
    "torch-fallback": "stands in for what Transformer Engine or apex would do; applied on GPUs too where they "
                      "do not import",
    "upstream-bug": "fixes a megatron-core fault that bites on GPUs too; applied on every host",
    "speed-memory": "saves time or memory and changes no value",
}
"""The kinds of patch, each with what it means."""

ON_CUDA = {
    "no": "no",
    "yes": "yes",
    "when-needed": "when",
}
"""Whether a patch applies on a CUDA host: never, always, or as its module's `applies_on_cuda()` answers
(the record's `cuda_condition` says when, in words)."""

KIND_ON_CUDA = {"cpu-gloo": ("no",), "torch-fallback": ("when-needed",), "upstream-bug": ("yes",),
                "speed-memory": ("yes", "when-needed", "no")}
"""The ON_CUDA values each kind allows."""

STAGES = ("apply", "import")
"""When a patch runs: in `patches.apply_all()`, or while `patches` imports megatron-core."""


@dataclass(frozen=True)
class PatchRecord:
    """One patch: its module under patches/, what it is for, where it applies and when it can go."""

    name: str
    """Module name under patches/ (and the patch's NAME)."""
    kind: str
    """One of KINDS."""
    on_cuda: str
    """One of ON_CUDA."""
    removable_when: str
    """The condition under which the patch can be deleted (as its docstring states it)."""
    cuda_condition: str = ""
    """For on_cuda "when-needed": when `applies_on_cuda()` holds, in words; empty otherwise."""
    targets: tuple[str, ...] = ("0.16.1",)
    """megatron-core versions the patch was checked against (its TARGET_VERSIONS)."""
    stage: str = "apply"
    """One of STAGES."""


def _cpu(name: str, removable_when: str) -> PatchRecord:
    """A CPU/gloo enablement row: never applied where CUDA is present."""
    return PatchRecord(name, "cpu-gloo", "no", removable_when)


def _fallback(name: str, cuda_condition: str, removable_when: str) -> PatchRecord:
    """A torch stand-in row: on CUDA where its module's applies_on_cuda() holds (`cuda_condition`)."""
    return PatchRecord(name, "torch-fallback", "when-needed", removable_when, cuda_condition)


NO_TE = "Transformer Engine does not import"
NO_TE_APEX = "neither apex nor Transformer Engine imports"


def _bug(name: str, removable_when: str) -> PatchRecord:
    """An upstream-fault row: applied on every host."""
    return PatchRecord(name, "upstream-bug", "yes", removable_when)


PATCHES = (
    _cpu("cuda_current_device", "megatron-core allocates on the device of its inputs (or on a configurable "
                                "device) in these modules."),
    _cpu("cuda_rng_tracker", "megatron-core's RNG tracker takes a device (or a generator) instead of assuming CUDA."),
    _cpu("ddp_grad_buffer_streams", "megatron-core's DDP takes the buffer device from the parameters and skips "
                                    "streams off-GPU."),
    _cpu("hardcoded_cuda_device", "these modules allocate on the parameters' device."),
    _cpu("clip_grads_type_dispatch", "megatron-core dispatches on `param.dtype` instead of the legacy type strings."),
    _fallback("torch_norm_sequence_parallel", NO_TE,
              "megatron-core's WrappedTorchNorm marks its parameters for sequence parallelism itself."),
    _fallback("torch_norm_zero_centered_gamma", NO_TE,
              "megatron-core's WrappedTorchNorm supports zero_centered_gamma itself."),
    _cpu("embedding_weight_sync", "megatron-core stops moving the weight (it is already on its device)."),
    _cpu("vpp_batched_p2p_guard", "never for gloo while batch_isend_irecv keeps its gloo semantics; drop it once "
                                  "Megatron-Core itself refuses the combination."),
    _cpu("dist_checkpointing_cuda", "dist_checkpointing takes its device from the process group backend."),
    PatchRecord("dist_checkpointing_results_queue", "speed-memory", "no",
                "megatron-core makes its results queue only for asynchronous saves."),
    _cpu("distrib_optimizer_gather", "megatron-core moves the shard to the group's device instead of CUDA."),
    _bug("fully_reshardable_bucket_offsets", "the megatron-core in use contains that fix."),
    _fallback("distrib_optimizer_torch_adam_step", NO_TE_APEX + " (torch's Adam runs)",
              "upstream skips `step` there (or when apex/TE's fused Adam is installed)."),
    _cpu("grad_scaler_cuda", "the grad scaler allocates on the parameters' device."),
    PatchRecord("multi_tensor_on_device", "speed-memory", "when-needed",
                "upstream's fallbacks keep the norm on the device.", NO_TE_APEX),
    _fallback("wgrad_accumulation_torch", "apex's fused_weight_gradient_mlp_cuda does not import",
              "megatron-core accumulates weight gradients without apex, or apex installs here."),
    _cpu("moe_cuda_device", "megatron-core's MoE layer takes its device from its inputs and skips streams off-GPU."),
    _cpu("moe_split_sizes_cpu", "maybe_move_tensor_to_cpu converts CPU tensors to numpy as well."),
    _fallback("moe_router_gemm_without_te", NO_TE, "moe_utils sets te_general_gemm = None in its ImportError branch."),
    _bug("expert_bias_inplace", "MLP.forward adds the expert bias out of place."),
    PatchRecord("glu_offset_copy", "speed-memory", "yes", "MLP.forward skips the add at offset zero."),
    _bug("expert_bias_sequence_parallel", "RowParallelLinear leaves expert biases out of the sequence-parallel "
                                          "gradient sum."),
    _cpu("gloo_uneven_gather", "torch's gloo backend accepts uneven all_gather / reduce_scatter lists."),
    _cpu("moe_aux_loss_avg_gloo", "torch's gloo backend implements ReduceOp.AVG."),
    _bug("moe_per_token_aux_loss_tp", "router.py scales the attached losses by the token count of the TP group's "
                                      "whole micro-batch under per-token loss."),
    _fallback("checkpoint_without_output_te", NO_TE,
              "CheckpointWithoutOutput only enters its fp8 path with Transformer Engine present."),
    _cpu("rope_cp_rank_cpu", "get_pos_emb_on_this_cp_rank builds its index on pos_emb's device."),
    _fallback("mla_without_te", NO_TE,
              "multi_latent_attention.py takes HAVE_TE from the extension (or checks that TE imports)."),
    _bug("mla_tensor_parallel", "MLASelfAttention reduces the RoPE key's gradient over TP and uses self.tp_group "
                                "in its mappings."),
    _bug("mla_latent_norm_grads", "finalize_model_grads sums only per-head q/k norm gradients."),
    _bug("mtp_tied_output_weight", "GPTModel skips the output weight when `mtp_process` shares the embedding (or "
                                   "the tie no longer asserts)."),
    PatchRecord("deferred_compile", "speed-memory", "yes",
                "megatron-core no longer decorates with torch.compile at import.", stage="import"),
)
"""Every patch, in the order apply_all applies them."""

RECORDS = {record.name: record for record in PATCHES}


def applied_names() -> tuple[str, ...]:
    """The patches apply_all applies (on a CPU host, all of them), in order."""
    return tuple(record.name for record in PATCHES if record.stage == "apply")


README_BEGIN = "<!-- patches table: generated from patches/registry.py by `python -m patches` -->"
README_END = "<!-- end of patches table -->"


def readme_table() -> str:
    """The README's patch table, generated from PATCHES (between README_BEGIN and README_END)."""
    counts = ", ".join(f"{sum(r.kind == kind for r in PATCHES)} {kind}" for kind in KINDS)
    lines = [README_BEGIN, "", f"{len(PATCHES)} patches: {counts}.", ""]
    lines += [f"- `{kind}`: {meaning}." for kind, meaning in KINDS.items()]
    lines += ["", "| Patch | Kind | On CUDA | Targets megatron-core | Removable when |", "|---|---|---|---|---|"]
    for r in PATCHES:
        on_cuda = " ".join(filter(None, (ON_CUDA[r.on_cuda], r.cuda_condition)))
        on_cuda += " (while `patches` imports megatron-core)" if r.stage == "import" else ""
        lines.append(f"| [`{r.name}`](patches/{r.name}.py) | {r.kind} | {on_cuda} | {', '.join(r.targets)} | "
                     f"{r.removable_when} |")
    return "\n".join(lines + ["", README_END])


def readme_section(readme_text: str) -> str:
    """The generated table as it stands in `readme_text` (empty when its markers are missing)."""
    return marked_section(readme_text, README_BEGIN, README_END)


def write_readme(path: Path) -> bool:
    """Replace the table between the markers of the README at `path`; True when the text changed."""
    return replace_marked_section(path, README_BEGIN, README_END, readme_table())
