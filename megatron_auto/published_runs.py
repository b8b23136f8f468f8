"""NVIDIA's published H100 pre-training runs, each priced at its own configuration.

Rows: shared/reference/published_h100/runs.json (its README says what they are) and the rows added here
with their citations (data/published_h100/). Each row is priced with exactly what `megatron-auto estimate`
does for the row's flags (cli.estimate_command.estimate_flags on the argv of `estimate_argv`), and the
planner's own plan for the same job with what `megatron-auto plan` does. A row's measured step time is
the source's own (derived from its tokens per second), or, where a source gives only TFLOP/s, the step
time those TFLOP/s imply under the source's FLOP count (`megatron_lm_flops`).
"""
from __future__ import annotations

import json
import re
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

GPU_CLUSTER = "dgx-h100-80gb"
MODEL_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size", "ffn_hidden_size",
              "num_query_groups", "kv_channels", "swiglu", "num_experts", "moe_router_topk", "moe_ffn_hidden_size",
              "qk_layernorm")
"""Row keys that are the compact model form's keys. Beyond the shared schema a row may carry `model_preset`
(a preset that is its architecture, e.g. deepseek-v3's multi-latent attention) and `estimate_flags` (flags
its source or recipe states that the table's columns cannot: the pipeline split, the FP8 recipe)."""


@dataclass(frozen=True)
class PublishedRun:
    """One published run: its model in Megatron's names, its flags, and its measured step time."""

    id: str
    model: dict
    """The compact model form (specs.model.model_from_dict), or {"preset": NAME}."""
    num_gpus: int
    gpus_per_node: int
    global_batch_size: int
    precision: str
    """bf16 or fp8."""
    flags: tuple[str, ...]
    """The layout flags the source states, as `megatron-auto estimate` takes them."""
    recipe: tuple[str, ...]
    """The knobs the run's recipe turns (_recipe_flags), priced for the row's layout and the planner's alike."""
    measured_step_s: float
    source: str
    collection: str = ""
    """The rows file it came from (its folder and name), to summarise each collection apart."""
    release: str = ""
    """The software that ran it, as the row names it (e.g. "NeMo 24.07", "Megatron-Core r0.8.0 (README 2024-07)")."""

    @property
    def release_year(self) -> Optional[int]:
        """The year of that software: a NeMo container's YY.MM, or a date the row gives; None when neither."""
        nemo = re.search(r"NeMo (\d\d)\.\d\d", self.release)
        if nemo:
            return 2000 + int(nemo.group(1))
        dated = re.search(r"\b(20\d\d)-\d\d", self.release)
        return int(dated.group(1)) if dated else None

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def gpus_per_node_used(self) -> int:
        """A run on part of one node (4 of its 8 GPUs) is a node of that many GPUs."""
        return min(self.num_gpus, self.gpus_per_node)


def megatron_lm_flops(model: dict, batch: int) -> float:
    """Megatron-LM's num_floating_point_operations (megatron/training/training.py, 2024): 12 B s l h^2 x
    [(1 + g/a + s/h) x q/h + f/h x topk x (3/2 if swiglu) + V / (2 l h)], with q the query width a x kv
    channels; the count behind the TFLOP/s of the Megatron-LM README and its MoE README."""
    h, l, s, a = model["hidden_size"], model["num_layers"], model["seq_length"], model["num_attention_heads"]
    g = model.get("num_query_groups") or a
    query = (model.get("kv_channels") or h // a) * a
    ffn = model.get("moe_ffn_hidden_size") if model.get("num_experts") else model.get("ffn_hidden_size")
    ffn = ffn or 4 * h
    topk = model.get("moe_router_topk") or 1 if model.get("num_experts") else 1
    gated = 1.5 if model.get("swiglu") else 1.0
    bracket = (1 + g / a + s / h) * query / h + ffn / h * topk * gated + model["vocab_size"] / (2 * l * h)
    return 12 * batch * s * l * h * h * bracket


def _model_of(row: dict) -> dict:
    """The row's architecture in the compact model form: Llama-style (RMSNorm, RoPE, no biases) where the
    MLP is gated, GPT-style (LayerNorm, learned positions, biases) otherwise; or the row's preset."""
    if row.get("model_preset"):
        return {"preset": row["model_preset"]}
    model = {key: row[key] for key in MODEL_KEYS if row.get(key) is not None}
    if row.get("moe_shared_expert_ffn_hidden_size"):
        model["moe_shared_expert_intermediate_size"] = row["moe_shared_expert_ffn_hidden_size"]
    model["name"] = row["id"]
    model["untie_embeddings_and_output_weights"] = bool(row.get("untied_embeddings"))
    if not _keeps_dropout(row):
        model.update(hidden_dropout=0.0, attention_dropout=0.0)
    if row.get("swiglu"):
        model.update(normalization="RMSNorm", add_bias_linear=False, position_embedding_type="rope")
    elif (row.get("model") or "").startswith("Nemotron"):
        # NeMo-Framework-Launcher conf/training/nemotron/nemotron_8b.yaml (bias: false, position_embedding_type:
        # rope, squared-relu, layernorm1p) and NeMo 2's NemotronConfig: no linear biases, RoPE; LayerNorm1p and
        # squared ReLU cost what LayerNorm and GeLU cost (specs/model.py).
        model.update(add_bias_linear=False, position_embedding_type="rope")
    return {**model, **row.get("model_overrides", {})}


def _keeps_dropout(row: dict) -> bool:
    """GPT-3 (NeMo-Framework-Launcher conf/training/gpt3/*.yaml: hidden_dropout 0.1) and the Megatron-LM README's
    GPT runs (Megatron-LM's default 0.1) train with dropout; the other models' configs set both probabilities
    to 0 (NeMo nemo/collections/llm/gpt/model/llama.py LlamaConfig, nemotron.py NemotronConfig, and the MoE
    configs built on them)."""
    name = row.get("model") or ""
    return name.startswith("GPT") and "OSS" not in name


def _flags_of(row: dict) -> tuple[str, ...]:
    """The row's own layout as estimate flags: what the source does not state is left to estimate's choice."""
    flags = ["--tp", str(row["tp"]), "--pp", str(row["pp"])]
    for name, key in (("--cp", "cp"), ("--ep", "ep"), ("--etp", "etp"), ("--micro-batch-size", "micro_batch_size")):
        if row.get(key):
            flags += [name, str(row[key])]
    if row.get("vp") and "--pipeline-model-parallel-layout" not in row.get("estimate_flags", ()):
        flags += ["--virtual-stages", str(row["vp"])]  # a layout fixes the chunks itself
    if row["tp"] > 1:
        flags.append("--sequence-parallel")  # NVIDIA's recipes turn SP on with TP (and the MoE README requires it)
    flags.append("--distributed-optimizer")  # NeMo's and Megatron-LM's performance recipes use it
    if row.get("recompute"):
        flags += ["--recompute", str(row["recompute"])]
    return tuple(flags) + _row_flags(row)[0]


RECIPE_KNOBS = {"--fp8-recipe": 1, "--moe-token-dispatcher-type": 1, "--moe-flex-dispatcher-backend": 1,
                "--overlap-moe-expert-parallel-comm": 0, "--delay-wgrad-compute": 0, "--cross-entropy-loss-fusion": 0,
                "--cross-entropy-fusion-impl": 1, "--cuda-graph-impl": 1, "--cuda-graph-scope": None,
                "--fine-grained-activation-offloading": 0, "--offload-modules": None,
                "--min-offloaded-tensor-size": 1, "--fp8-param-gather": 0, "--tp-comm-overlap": 1,
                "--use-precision-aware-optimizer": 0, "--main-grads-dtype": 1, "--main-params-dtype": 1,
                "--exp-avg-dtype": 1, "--exp-avg-sq-dtype": 1, "--moe-shared-expert-overlap": 0,
                "--moe-deepep-num-sms": 1, "--moe-hybridep-num-sms": 1}
"""Flags of a row's `estimate_flags` that are its recipe's knobs, not its layout (with how many values each
takes; None: every value up to the next flag): the planner's plan for the same job is priced with them too."""


def _row_flags(row: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The row's `estimate_flags` split into (layout, recipe knobs)."""
    layout, knobs, given = [], [], list(row.get("estimate_flags", ()))
    while given:
        flag = given.pop(0)
        if flag in RECIPE_KNOBS:
            count = RECIPE_KNOBS[flag]
            if count is None:
                count = next((i for i, token in enumerate(given) if token.startswith("--")), len(given))
            knobs += [flag, *given[:count]]
            del given[:count]
        else:
            layout.append(flag)
    return tuple(layout), tuple(knobs)


NEMO_RECIPE_SOURCE = ("NVIDIA/NeMo-Framework-Launcher examples/training/*/h100/*.sh (+training.model.optim."
                      "grad_sync_dtype=bf16) and launcher_scripts/conf/training/* (ub_tp_comm_overlap)")
"""Where the knobs of NeMo's published runs come from: gradients reduced in bf16, and TE's TP communication
overlap on every model with tp > 1."""
MEGATRON_README_RECIPE = ("Megatron-LM README, 'Training Speed and Scalability' (commit f2e5db4): fine-grained overlap "
                          "of DP (--overlap-grad-reduce --overlap-param-gather), TP (--tp-comm-overlap) and PP")
"""What the Megatron-LM README says its scaling runs turned on; gradients stay in fp32 (Megatron-LM's default
under bf16)."""

SHARED_ROW_RECIPES = Path(__file__).resolve().parents[1] / "data" / "published_h100" / "recipes" / "shared_rows.json"
"""What the recipes of the shared rows (shared/reference/published_h100/runs.json, read-only) ran beyond their
table, read in the recipe code with citations: per row id, `estimate_flags` to add and row `fields` to set."""


def with_recipe_audit(row: dict, audits: dict) -> dict:
    """`row` with its audit entry (SHARED_ROW_RECIPES) applied: its fields set, its estimate flags added."""
    entry = audits.get(row["id"])
    if entry is None:
        return row
    return {**row, **entry.get("fields", {}),
            "estimate_flags": [*row.get("estimate_flags", ()), *entry.get("estimate_flags", ())]}


def _recipe_flags(row: dict) -> list[str]:
    """The knobs the row's recipe turns beyond its table (NEMO_RECIPE_SOURCE, MEGATRON_README_RECIPE, and the
    row's own RECIPE_KNOBS, for a shared row those of its SHARED_ROW_RECIPES entry: e.g. its FP8 recipe,
    dispatcher and EP overlap; NeMo's and Megatron-Bridge's MoE recipes also batch the experts' GEMMs,
    moe_grouped_gemm; the Megatron-Core MoE README states none). Every row ran Megatron's fused bias +
    activation and, with Transformer Engine, its fused RoPE: Megatron-LM's defaults, and set in NeMo's model
    configs (LlamaConfig: bias_activation_fusion, apply_rope_fusion True). A row's `recipe_defaults_off` names
    the defaults its recipe did not turn (NeMo 1.x's Grok-1 config keeps moe_grouped_gemm false; NeMo 25.04's
    DeepSeek-V3 reduces gradients in fp32)."""
    overlap = ["--tp-comm-overlap"] if row["tp"] > 1 else []
    grouped = ["--moe-grouped-gemm"] if row.get("num_experts") or row.get("model_preset") else []
    fusions = ["--bias-fusions", "on", "--rope-fusion", *_row_flags(row)[1]]
    if "NeMo" in row["framework"]:
        defaults = [flag for flag in ("--grad-reduce-in-bf16", *overlap, *grouped)
                    if flag not in row.get("recipe_defaults_off", ())]
        return [*defaults, *fusions]
    if row["id"].startswith("mlm_readme"):
        return [*overlap, *fusions]
    return fusions


def _measured_step_s(row: dict, model: dict) -> float:
    derived = row.get("derived") or {}
    if derived.get("step_time_s_from_tokens"):
        return float(derived["step_time_s_from_tokens"])
    tflops = row["measured"]["model_tflops_per_gpu"]
    return megatron_lm_flops(model, row["global_batch_size"]) / (row["num_gpus"] * tflops * 1e12)


def run_from_row(row: dict) -> PublishedRun:
    model = _model_of(row)
    source = row["source"]
    return PublishedRun(
        id=row["id"], model=model, num_gpus=row["num_gpus"], gpus_per_node=row["gpus_per_node"],
        global_batch_size=row["global_batch_size"], precision=row["precision_class"].lower(),
        flags=_flags_of(row), recipe=tuple(_recipe_flags(row)), measured_step_s=_measured_step_s(row, model),
        source=f"{source['repo']}/{source['path']}@{source['commit'][:7]}", release=row.get("release") or "")


def load_runs(*paths: Path) -> list[PublishedRun]:
    """Every row of the given runs.json files, each with its recipe audit (SHARED_ROW_RECIPES) applied."""
    from dataclasses import replace

    audits = json.loads(SHARED_ROW_RECIPES.read_text())["rows"]
    return [replace(run_from_row(with_recipe_audit(row, audits)), collection="/".join(Path(path).parts[-3:]))
            for path in paths for row in json.loads(Path(path).read_text())["rows"]]


def job_argv(run: PublishedRun, model_path: str) -> list[str]:
    """The job flags shared by `estimate` and `plan`."""
    return ["--model", model_path, "--cluster", GPU_CLUSTER, "--num-nodes", str(run.num_nodes),
            "--gpus-per-node", str(run.gpus_per_node_used), "--global-batch-size", str(run.global_batch_size),
            "--precision", run.precision, *run.recipe]


@dataclass(frozen=True)
class PricedRun:
    run: PublishedRun
    estimate: object
    """The Plan (with its prediction) of the run's own flags, or None."""
    picked: tuple[str, ...]
    """What estimate chose where the source is silent."""
    error: Optional[str]
    """Why the run's flags could not be priced."""
    planned: object = None
    """The planner's own plan for the same job, or None."""

    @property
    def predicted_step_s(self) -> Optional[float]:
        return self.estimate.prediction.iteration_time_s if self.estimate is not None else None

    @property
    def step_error(self) -> Optional[float]:
        predicted = self.predicted_step_s
        return None if predicted is None else predicted / self.run.measured_step_s - 1


def price_run(run: PublishedRun, with_plan: bool = False) -> PricedRun:
    """The run at its own flags (as `megatron-auto estimate`), and with `with_plan` the planner's plan."""
    from .errors import UserError

    with _job(run) as job:
        try:
            plan, picked = _estimate(job, run.flags)
        except UserError as error:
            return PricedRun(run, None, (), str(error))
        planned = _planner_plan(job) if with_plan else None
    return PricedRun(run, plan, tuple(picked), None, planned)


MICRO_BATCH_SIZES = (1, 2, 4, 8)
"""The micro-batch sizes weighed where a source leaves it unstated (unstated_layout_errors)."""


def unstated_layout_errors(run: PublishedRun) -> list[tuple[int, int, float]]:
    """(micro-batch size, virtual stages, step error) at each layout that estimate accepts and predicts to fit, over
    what the run's source leaves unstated: the micro-batch (MICRO_BATCH_SIZES) and, with pipeline stages and no
    stated chunks, the virtual stages (each divisor of the layers a stage holds). Empty for a run whose source states
    its micro-batch. Estimate picks the fastest such layout, the optimistic end of this range: the range is how much
    of the row's error rests on the unstated choices."""
    from .errors import UserError

    if "--micro-batch-size" in run.flags:
        return []
    errors = []
    with _job(run) as job:
        for size in MICRO_BATCH_SIZES:
            for chunks in _unstated_virtual_stages(run):
                flags = ("--micro-batch-size", str(size)) + (("--virtual-stages", str(chunks)) if chunks else ())
                try:
                    plan, _ = _estimate(job, (*run.flags, *flags))
                except UserError:
                    continue
                if plan.prediction.fits:
                    error = plan.prediction.iteration_time_s / run.measured_step_s - 1
                    errors.append((size, plan.virtual_stages, error))
    return errors


def _unstated_virtual_stages(run: PublishedRun) -> tuple[Optional[int], ...]:
    """The virtual stages to weigh for `run`: every divisor of the layers a stage holds where the source states
    neither them nor a split and the layers divide evenly; else (None,), estimate's own pick."""
    from .search.integers import divisors
    from .specs.presets import MODEL_PRESETS

    stated = {"--virtual-stages", "--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers",
              "--decoder-last-pipeline-num-layers"}
    pp = int(run.flags[run.flags.index("--pp") + 1]) if "--pp" in run.flags else 1
    layers = (MODEL_PRESETS[run.model["preset"]].num_layers if "preset" in run.model
              else run.model.get("num_layers", 0))
    if pp == 1 or stated & set(run.flags) or not layers or layers % pp:
        return (None,)
    return tuple(divisors(layers // pp))


@contextmanager
def _job(run: PublishedRun) -> Iterator[list[str]]:
    """The job flags of `run` (job_argv), its model written to a temporary file unless it is a preset."""
    with tempfile.TemporaryDirectory() as folder:
        model_path = run.model.get("preset") or str(Path(folder) / f"{run.id}.json")
        if "preset" not in run.model:
            Path(model_path).write_text(json.dumps(run.model))
        yield job_argv(run, model_path)


def _estimate(job: list[str], flags: tuple[str, ...]):
    """`megatron-auto estimate` of the job at `flags`: (plan, what it picked)."""
    from .cli.estimate_command import estimate_flags
    from .cli.parser import parse_args

    return estimate_flags(parse_args(["estimate", *job, *flags]))


def _planner_plan(job: list[str]):
    """`megatron-auto plan` for the job (the megatron space, default flags), or None when nothing fits."""
    from .cli.job import load_job
    from .cli.parser import parse_args
    from .cli.plan_command import constraints_from_args, search_choices
    from .errors import UserError
    from .search import search_plan

    args = parse_args(["plan", *job])
    model, cluster, training = load_job(args)
    try:
        return search_plan(model, cluster, training, space="megatron", constraints=constraints_from_args(args),
                           **search_choices(args)).plan
    except UserError:
        return None
