"""--num-virtual-stages-per-pipeline-rank: Megatron-LM's other spelling of the interleaved pipeline layout.

Megatron-LM 0.16.1 takes the virtual pipeline degree either as layers per virtual stage or as model chunks per
pipeline rank; both describe the same layout. This runtime runs the first form, so the second is turned into it
here (as Megatron-LM's validate_args turns both into virtual_pipeline_model_parallel_size), with Megatron-LM's
rule that at most one of the two, or a --pipeline-model-parallel-layout, is given.
"""
from __future__ import annotations

import argparse
from typing import Optional


def layers_per_virtual_stage(args: argparse.Namespace) -> tuple[Optional[int], Optional[str]]:
    """(--num-layers-per-virtual-pipeline-stage to run, or the one-line problem with the flags)."""
    chunks = args.num_virtual_stages_per_pipeline_rank
    if chunks is None:
        return args.num_layers_per_virtual_pipeline_stage, None
    if args.num_layers_per_virtual_pipeline_stage is not None or args.pipeline_model_parallel_layout is not None:
        return None, ("No more than one of --num-layers-per-virtual-pipeline-stage, "
                      "--num-virtual-stages-per-pipeline-rank, --pipeline-model-parallel-layout can be set at the "
                      "same time (as in Megatron-LM)")
    if chunks < 1:
        return None, f"--num-virtual-stages-per-pipeline-rank must be at least 1, got {chunks}"
    if args.decoder_first_pipeline_num_layers is not None or args.decoder_last_pipeline_num_layers is not None:
        return None, ("--num-virtual-stages-per-pipeline-rank with --decoder-first/last-pipeline-num-layers is not "
                      "run here yet: give the chunks as --pipeline-model-parallel-layout")
    if chunks == 1:
        return None, None  # Megatron-LM: one chunk per rank is no virtual pipeline
    # Megatron-LM counts the embedding and the loss as layers when the split accounts for them.
    layers = (args.num_layers + int(args.account_for_embedding_in_pipeline_split)
              + int(args.account_for_loss_in_pipeline_split))
    ranks = args.pipeline_model_parallel_size or 1
    if layers % (ranks * chunks):
        return None, (f"--num-virtual-stages-per-pipeline-rank {chunks}: the {layers} layers of the pipeline split "
                      f"do not make {ranks} x {chunks} chunks of equal size")
    return layers // (ranks * chunks), None
