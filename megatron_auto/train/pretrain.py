"""The run of Megatron-LM's pretrain_gpt.py command line: adjust the flags as Megatron-LM does, choose the
plan, check it, then train it (or only price it, --auto-parallel-dry-run); `main` is the entry point."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

from megatron_auto.errors import UserError
from megatron_auto.runtime.settings import TrainSettings
from megatron_auto.runtime.tokenizers import tokenizer_from_flags
from megatron_auto.specs.model import ModelSpec

from .arguments import parse_args
from .dry_run import dry_run
from .log import logger
from .plan_choice import (check_plan_runs, choose_plan, override_lines, plan_basis, replanner,
                          with_plan_recompute_modules)
from .settings import model_from_args, no_effect_reasons, precision_summary, settings_from_args


def megatron_lm_adjustments(args: argparse.Namespace) -> list[str]:
    """Flags Megatron-LM turns off with a warning rather than refuse; returns the warnings (mutates `args`)."""
    warnings_given = []
    if args.sequence_parallel and args.auto_parallel:
        warnings_given.append("--sequence-parallel: under --auto-parallel sequence parallelism is the planner's "
                              "choice (with tensor parallelism)")
    split_flags = [flag for flag, given in (
        ("--decoder-first-pipeline-num-layers", args.decoder_first_pipeline_num_layers is not None),
        ("--decoder-last-pipeline-num-layers", args.decoder_last_pipeline_num_layers is not None),
        ("--account-for-embedding-in-pipeline-split", args.account_for_embedding_in_pipeline_split),
        ("--account-for-loss-in-pipeline-split", args.account_for_loss_in_pipeline_split),
        ("--pipeline-model-parallel-layout", args.pipeline_model_parallel_layout is not None)) if given]
    if split_flags and args.auto_parallel:
        warnings_given.append(f"{', '.join(split_flags)}: under --auto-parallel the planner splits the layers over "
                              "the pipeline stages (it prices the embedding and the loss on their stages)")
    if args.context_parallel_size > 1 and args.attention_backend == "auto":
        args.attention_backend = "flash"  # the core attention that runs context parallelism, on CPU too
    if args.moe_token_dispatcher_type == "flex":
        warnings_given.append("--moe-token-dispatcher-type flex: DeepEP/HybridEP kernels are not available here; "
                              "the alltoall dispatcher moves the same tokens")
    if args.sequence_parallel and not args.auto_parallel and (args.tensor_model_parallel_size or 1) == 1:
        args.sequence_parallel = False
        warnings_given.append("Disabling sequence parallelism because tensor model parallelism is disabled")
    return warnings_given


def log_run_header(args: argparse.Namespace, adjustments: list[str], settings: TrainSettings, model: ModelSpec,
                   plan) -> None:
    """The log lines before training: warnings, flags without effect, precision, kernels and the plan."""
    from megatron_auto.report import plan_table
    from megatron_auto.runtime import kernels
    from megatron_auto.runtime.config import param_gather_overlap_requested

    for line in adjustments:
        logger.warning("%s", line)
    for flag, reason in no_effect_reasons(args):
        logger.info("accepted without effect here: %s (%s)", flag, reason)
    logger.info("precision: %s", precision_summary(settings))
    logger.info("%s", kernels.kernels_for_run(model, settings).describe())
    if param_gather_overlap_requested(settings) and any(s.zero == 1 for s in (*plan.distinct_strategies, plan.embedding)):
        logger.info("distributed optimizer: the updated weights are all-gathered during the next forward "
                    "(--overlap-param-gather)")
    if plan.recomputes_selectively:
        logger.info("selective recompute re-runs: %s (--recompute-modules)", " ".join(settings.recompute_modules))
    logger.info("parallel plan (%s):\n%s", "auto-parallel" if args.auto_parallel else "flags", plan_table(plan))


def log_tokenizer_and_data(args: argparse.Namespace, tokenizer) -> None:
    """The tokenizer's line, and the data flags that change nothing here, with the reason."""
    logger.info("tokenizer: %s, vocabulary %d, end of document %d", tokenizer.kind, tokenizer.vocab_size,
                tokenizer.eod)
    if not args.create_attention_mask_in_dataloader:
        logger.info("--no-create-attention-mask-in-dataloader: without effect here (the dataloader never "
                    "builds attention masks; the attention kernel applies the causal mask)")


def run(args: argparse.Namespace) -> None:
    """Choose and check the plan before any work, then train it under its process groups. The tokenizer and the
    settings are read first: a bad file or flag is refused before torch and megatron-core are imported (~4 s)."""
    adjustments = megatron_lm_adjustments(args)
    tokenizer = tokenizer_from_flags(args)
    settings = settings_from_args(args, tokenizer.vocab_size, tokenizer.eod)
    model = model_from_args(args, args.padded_vocab_size or tokenizer.vocab_size)  # the rows the planner prices
    import patches
    from megatron_auto.runtime import checkpoint, distributed, fit, planning, session
    from megatron_auto.runtime.kernels import use_matmul_flags
    from megatron_auto.runtime.stragglers import Policy

    use_matmul_flags(args.disable_bf16_reduced_precision_matmul)
    patches.apply_all()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    gpus_per_node = planning.gpus_per_node_from_env(world_size, cluster_name=args.auto_parallel_cluster)
    plan = choose_plan(args, model, world_size, settings, gpus_per_node)
    adjustments = [*adjustments, *override_lines(args, plan)]
    settings = with_plan_recompute_modules(args, settings, plan)
    check_plan_runs(plan, settings, model)
    if args.auto_parallel_dry_run:
        return dry_run(args, adjustments, plan, model, world_size, settings, gpus_per_node)
    info = distributed.init_distributed(settings.timeout_s)
    try:
        checkpoint.check_paths(settings.save, settings.load, settings.non_persistent_save_dir)
        if session.is_logging_rank():
            log_run_header(args, adjustments, settings, model, plan)
            log_tokenizer_and_data(args, tokenizer)
        basis = plan_basis(args, plan, model, world_size, settings, gpus_per_node)
        if basis is None:
            job = session.build_session(plan, model, settings, info.backend, info.device)
            if settings.starts_from_checkpoint:
                session.resume(job)
            session.train(job)
        else:
            if session.is_logging_rank():
                logger.info("%s", planning.describe_job_cluster(basis.cluster, world_size, gpus_per_node))
            stragglers = Policy(args.auto_parallel_straggler_threshold, args.auto_parallel_straggler_interval)
            fit.train_fitting(plan, basis, settings, info, replanner(args, basis), restart=args.auto_parallel,
                              stragglers=stragglers)
    finally:
        distributed.shutdown()


def configure_logging() -> None:
    """Log lines as bare messages on stdout; megatron's own at warnings only; the search on rank 0 only."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    logging.getLogger("megatron").setLevel(logging.WARNING)
    if int(os.environ.get("RANK", "0")) != 0:
        # Every rank runs the same deterministic search; one rank reports it.
        logging.getLogger("megatron_auto.search").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="megatron")
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def main(argv: list[str] | None = None) -> int:
    """pretrain_gpt.py: 0 when the run ends, 2 on a user error, 1 when training diverged or a peer failed;
    each error is one line on stderr."""
    args = parse_args(argv)
    configure_logging()
    try:
        run(args)
    except UserError as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    except Exception as error:  # noqa: BLE001  (re-raised unless it is one of the run failures below)
        said = _run_failure(error)
        if said is None:
            raise
        sys.stderr.write(f"error: {said}\n")
        return 1
    return 0


def _run_failure(error: Exception) -> str | None:
    """The line for a run that training stopped (Megatron-LM stops with an error too, its rerun state machine) or a
    peer that stalled or died (torchrun may restart the job); None for any other error. Imported here: a refusal
    before the run needs neither torch nor megatron-core."""
    from megatron_auto.runtime.faults import peer_failure
    from megatron_auto.runtime.stopping import TrainingDiverged

    if isinstance(error, TrainingDiverged):
        return str(error)
    return peer_failure(error) if isinstance(error, RuntimeError) else None
