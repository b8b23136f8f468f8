"""GPT model chunks on the local (or Transformer Engine) layer spec, wrapped in Megatron DDP."""
from __future__ import annotations

import logging
from dataclasses import replace

import torch

from ..specs.model import ModelSpec
from .layout import MegatronLayout
from ..parallel_dims import ParallelDims
from .settings import TrainSettings

logger = logging.getLogger(__name__)


def decoder_spec(model: ModelSpec, settings: TrainSettings, config, vp_stage):
    """GPTModel's layer spec for this rank's chunk: one TransformerLayer spec when all layers are alike
    (dense or MoE), else this chunk's per-layer specs (dense and MoE MLPs, Megatron's --moe-layer-freq)."""
    from . import kernels

    if len({layer.moe is None for layer in model.layers}) == 1:
        return kernels.layer_spec(model.layers[0], kernels.kernels_for_run(model, settings))
    from megatron.core.transformer import transformer_block
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    first = get_transformer_layer_offset(config, vp_stage=vp_stage)
    count = transformer_block.get_num_layers_to_build(config, vp_stage=vp_stage)
    return block_spec(model, settings, first, count)


def block_spec(model: ModelSpec, settings: TrainSettings, first: int, count: int):
    """TransformerBlockSubmodules of layers first ... first + count - 1: each the dense or the MoE spec."""
    from megatron.core.transformer import transformer_block

    from . import kernels

    run = kernels.kernels_for_run(model, settings)
    specs: dict = {}
    for layer in model.layers[first:first + count]:
        if (layer.moe is None) not in specs:
            specs[layer.moe is None] = kernels.layer_spec(layer, run)
    return transformer_block.TransformerBlockSubmodules(
        layer_specs=[specs[layer.moe is None] for layer in model.layers[first:first + count]],
        layer_norm=transformer_block.LayerNormImpl)


def mtp_block_spec(model: ModelSpec, settings: TrainSettings, config, vp_stage):
    """GPTModel's multi-token prediction block for this chunk, or None (no MTP, or not its last stage):
    Megatron-LM's gpt_builders builds it from the last decoder layer's spec (get_gpt_mtp_block_spec); here that
    layer's spec runs this run's kernels, and the MTP norms are the decoder's own norm class (the local spec's
    torch or apex norm; Transformer Engine's under its spec), its eh_proj the backend's column-parallel linear."""
    if not model.mtp_num_layers:
        return None
    from megatron.core.models.gpt import gpt_layer_specs

    from . import kernels

    run = kernels.kernels_for_run(model, settings)
    last_layer = kernels.layer_spec(model.layers[-1], run)
    return gpt_layer_specs.get_gpt_mtp_block_spec_for_backend(
        config, last_layer, backend=_mtp_backend(last_layer, run), vp_stage=vp_stage)


def _mtp_backend(last_layer, run):
    """Megatron-Core's spec provider of the run's layer spec, its layer norm pinned to the decoder's."""
    from megatron.core.models.backends import LocalSpecProvider

    if run.layer_spec == "transformer_engine":
        from megatron.core.extensions.transformer_engine_spec_provider import TESpecProvider

        return TESpecProvider()
    norm = last_layer.submodules.input_layernorm

    class DecoderNormProvider(LocalSpecProvider):
        # LocalSpecProvider.layer_norm() answers a module global that an RMSNorm spec rewrites (backends.py).
        def layer_norm(self, rms_norm: bool = False, for_qk: bool = False) -> type:
            return norm

    return DecoderNormProvider()


def set_random_seed(seed: int) -> None:
    """Megatron-LM's seeding: one seed per pipeline stage, plus the tensor-parallel RNG tracker."""
    from megatron.core import parallel_state, tensor_parallel

    stage_seed = seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    torch.manual_seed(stage_seed)
    tensor_parallel.model_parallel_cuda_manual_seed(stage_seed)


def build_chunks(model: ModelSpec, layout: MegatronLayout, settings: TrainSettings, config,
                 padded_vocab: int, device: torch.device) -> list[torch.nn.Module]:
    """This rank's GPTModel chunks (one per virtual stage), on `device`."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel

    chunks = []
    virtual = layout.dims.vp > 1
    for vp_stage in range(layout.dims.vp):
        stage = vp_stage if virtual else None
        chunk = GPTModel(
            config=config,
            transformer_layer_spec=decoder_spec(model, settings, config, stage),
            vocab_size=padded_vocab,
            max_sequence_length=settings.max_position_embeddings or model.seq_length,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=not virtual, vp_stage=stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=not virtual, vp_stage=stage),
            share_embeddings_and_output_weights=not model.untie_embeddings_and_output_weights,
            vp_stage=stage,
            mtp_block_spec=mtp_block_spec(model, settings, config, stage),
            **position_embedding_args(model, settings),
        )
        for param in chunk.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
        chunks.append(chunk.to(device))
    return chunks


def check_built_chunks(chunks: list[torch.nn.Module], chunk_layers: tuple[int, ...], pipeline_parallel: int) -> None:
    """Megatron-Core split the layers as the plan says (its own rules read the split flags and the layout
    again): chunk v of this rank is the plan's chunk v x pp + rank. A mismatch is a bug of this runtime."""
    from megatron.core import parallel_state

    rank = parallel_state.get_pipeline_model_parallel_rank()
    built = [len(chunk.decoder.layers) for chunk in chunks]
    planned = [chunk_layers[v * pipeline_parallel + rank] for v in range(len(chunks))]
    if built != planned:
        raise RuntimeError(f"pipeline rank {rank}: Megatron-Core built chunks of {built} layers, the plan has "
                           f"{planned}")


def first_decoder_layer(model: ModelSpec, settings: TrainSettings, device: torch.device,
                        recompute_granularity: str | None = None,
                        layout: MegatronLayout | None = None) -> tuple[torch.nn.Module, dict]:
    """Layer 0 of the GPTModel this runtime builds for `model` (its spec, kernels and config), seeded alike for
    every build and in the settings' precision, and the keywords its GPTModel hands the layer besides the
    hidden states (the RoPE table, gpt_rotary_table): one layer to measure on its own. At TP1/PP1 unless `layout`
    (one stage) says otherwise, with Megatron's model-parallel state initialised to match: then it holds this rank's
    shard, and its experts' (a MoE model's)."""
    from .config import DTYPES, transformer_config

    layout = layout or MegatronLayout(ParallelDims(), micro_batch_size=1, num_micro_batches=1,
                                      global_batch_size=1)
    layout = replace(layout, recompute_granularity=recompute_granularity)
    config = transformer_config(model, layout, settings, "nccl" if device.type == "cuda" else "gloo")
    torch.manual_seed(0)
    chunk = build_chunks(model, layout, settings, config, model.vocab_size, device)[0]
    return chunk.decoder.layers[0].to(DTYPES[settings.precision]), gpt_rotary_table(chunk, model)


def gpt_rotary_table(chunk, model: ModelSpec) -> dict:
    """The RoPE keyword GPTModel hands its layers: its table for a rope model, none otherwise, and none under
    multi-latent attention, which computes its own RoPE (GPTModel builds no table then; MLA asserts it gets none)."""
    if model.position_embedding_type != "rope" or chunk.config.multi_latent_attention:
        return {}
    return {"rotary_pos_emb": chunk.rotary_pos_emb(model.seq_length)}


def position_embedding_args(model: ModelSpec, settings: TrainSettings) -> dict:
    """GPTModel's position-embedding arguments for the model's type (learned_absolute, rope or none), with
    Llama 3.1's RoPE scaling (--use-rope-scaling) and linear position interpolation
    (--rotary-seq-len-interpolation-factor) when asked."""
    args = dict(position_embedding_type=model.position_embedding_type, rotary_base=model.rotary_base,
                rotary_percent=settings.rotary_percent)
    if settings.rope_scaling:
        args.update(rope_scaling=True, rope_scaling_factor=settings.rope_scaling_factor)
    if settings.rotary_interpolation_factor:
        args.update(seq_len_interpolation_factor=settings.rotary_interpolation_factor)
    return args


def wrap_float16(chunks: list[torch.nn.Module], config) -> list[torch.nn.Module]:
    """Megatron-LM's mixed precision: each chunk cast to bf16/fp16 in Float16Module (which casts the
    first stage's float inputs to 16-bit and the last stage's outputs to fp32); fp32 chunks unchanged.
    The fp32 master weights live in the optimizer (optimizer_config's bf16/fp16)."""
    if not (config.bf16 or config.fp16):
        return chunks
    from megatron.core.transformer.module import Float16Module

    return [Float16Module(config, chunk) for chunk in chunks]


def wrap_ddp(chunks: list[torch.nn.Module], config, ddp_config) -> list[torch.nn.Module]:
    """Megatron DDP around each chunk; only the first chunk's buffers are bucketed (Megatron-LM's rule)."""
    from megatron.core.distributed import DistributedDataParallel

    return [
        DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk,
                                disable_bucketing=index > 0)
        for index, chunk in enumerate(chunks)
    ]


def count_parameters(chunks: list[torch.nn.Module]) -> int:
    """Parameters held by this rank (shared embeddings counted where they live)."""
    return sum(p.numel() for chunk in chunks for p in chunk.parameters())
