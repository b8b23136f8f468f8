"""Build a hybrid plan's model chunks on this rank: groups, configs, blocks, shell, DDP per part."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ...plan import LayerStrategy, Plan
from ...specs.model import ModelSpec
from .. import config as configs
from .. import model as models
from ..settings import TrainSettings
from . import configs as hconfigs
from .groups import boundary_strategy
from .loss import use_group_cross_entropy
from .model import HybridChunk, HybridDecoder, attach, segment_block
from .process_groups import HybridProcessGroups
from .rng import PartRng, part_seed
from .segments import Segment, chunk_segments, stage_chunk_indices
from .sharded import ShardedPart

logger = logging.getLogger(__name__)


@dataclass
class BuildContext:
    """What every part of the model needs to be built on this rank."""

    plan: Plan
    model: ModelSpec
    settings: TrainSettings
    backend: str
    device: torch.device
    pgs: HybridProcessGroups
    padded_vocab: int


def pg_collection(ctx: BuildContext, strategy: LayerStrategy):
    """Megatron's group collection with this strategy's TP, DP and expert groups (PP/embedding from
    parallel_state, whose data-parallel group is the whole stage at its TP 1: the routers' tp_dp_cp group)."""
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection

    pgc = ProcessGroupCollection.use_mpu_process_groups()
    tp, dp = ctx.pgs.tp(strategy), ctx.pgs.dp(strategy)
    pgc.tp, pgc.dp, pgc.dp_cp, pgc.intra_dp_cp = tp, dp, dp, dp
    pgc.mp, pgc.tp_cp, pgc.tp_dp_cp = tp, tp, parallel_state.get_data_parallel_group()
    experts = ctx.pgs.experts(strategy)
    pgc.expt_tp, pgc.tp_ep, pgc.ep = experts["expt_tp"], experts["tp_ep"], experts["ep"]
    # The experts' optimizer takes tp_ep_pp as its model-parallel group: the expert TP group of this stage.
    pgc.expt_dp, pgc.intra_expt_dp, pgc.tp_ep_pp = experts["expt_dp"], experts["expt_dp"], experts["expt_tp"]
    pgc.intra_dist_opt = dp
    return pgc


def _wrap(ctx: BuildContext, config, strategy: LayerStrategy, module):
    from megatron.core.distributed import DistributedDataParallel

    from megatron.core import tensor_parallel

    for param in module.parameters():
        tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
    module = module.to(ctx.device)
    compute_dtype = configs.DTYPES[ctx.settings.precision]
    if strategy.zero >= 2:
        # FSDP2 keeps the fp32 shards as the master weights and casts to 16-bit for compute.
        return ShardedPart(config, module.float(), ctx.pgs.dp(strategy), ctx.pgs.tp(strategy),
                           reshard_after_forward=strategy.zero == 3, compute_dtype=compute_dtype)
    # Megatron-LM's Float16Module cast: 16-bit weights here, fp32 masters in the optimizer.
    module = module.to(compute_dtype)
    ddp_config = configs.ddp_config(hconfigs.strategy_layout(ctx.plan, strategy), ctx.settings)
    return DistributedDataParallel(config=config, ddp_config=ddp_config, module=module,
                                   pg_collection=pg_collection(ctx, strategy))


def _segment(ctx: BuildContext, segment: Segment, ends_model: bool):
    """(raw TransformerBlock of the segment, its config), on the device."""
    config = hconfigs.segment_config(ctx.model, ctx.plan, segment.strategy, ctx.settings, ctx.backend)
    submodules = models.block_spec(ctx.model, ctx.settings, segment.first, segment.count)
    # Per-segment seed: a layer's initial weights do not depend on which ranks build it.
    torch.manual_seed(ctx.settings.seed + 1 + segment.first)
    block = segment_block(config, submodules, segment, ends_model, pg_collection(ctx, segment.strategy))
    return block, config


class PartGroup(torch.nn.Module):
    """Modules of one layout under one DDP: one gradient buffer, one reduce-scatter, one optimizer."""

    def __init__(self, modules: list) -> None:
        super().__init__()
        self.members = torch.nn.ModuleList(modules)


def _group_key(ctx: BuildContext, strategy: LayerStrategy, is_shell: bool):
    """Parts with equal keys share a DDP; None keeps a part alone (ZeRO-3, or the tied shell under PP).
    The key holds the expert layout: a DDP reduces its experts' gradients over one expert-DP group."""
    if strategy.zero >= 2 or (is_shell and ctx.plan.pipeline_parallel > 1):
        return None
    return strategy.tp, strategy.dp, strategy.sp, strategy.zero, strategy.ep, strategy.expert_tp


def wrap_parts(ctx: BuildContext, members: list) -> list:
    """[(wrapped part, strategy)] for [(module, strategy, config, is_shell)], grouped by layout.

    A uniform plan thus runs one DDP and one optimizer per chunk, as the stock runtime does.
    """
    groups: dict = {}
    for index, (module, strategy, config, is_shell) in enumerate(members):
        key = _group_key(ctx, strategy, is_shell)
        groups.setdefault(key if key is not None else ("alone", index), []).append((module, strategy, config))
    wrapped = []
    for group in groups.values():
        module = group[0][0] if len(group) == 1 else PartGroup([m for m, _, _ in group])
        wrapped.append((_wrap(ctx, group[0][2], group[0][1], module), group[0][1]))
    return wrapped


def _shell(ctx: BuildContext, pre_process: bool, post_process: bool, vp_stage):
    """GPTModel with the embedding's layout and no decoder layers (embedding and/or LM head)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    strategy = ctx.plan.embedding
    config = hconfigs.segment_config(ctx.model, ctx.plan, strategy, ctx.settings, ctx.backend)
    # The shell ties its embedding across stages only when it knows the pipeline is deeper than 1.
    config.pipeline_model_parallel_size = ctx.plan.pipeline_parallel
    config.virtual_pipeline_model_parallel_size = ctx.plan.virtual_stages if ctx.plan.virtual_stages > 1 else None
    torch.manual_seed(ctx.settings.seed)
    shell = GPTModel(
        config=config, transformer_layer_spec=TransformerBlockSubmodules(layer_specs=[], layer_norm=None),
        vocab_size=ctx.padded_vocab, max_sequence_length=ctx.settings.max_position_embeddings or ctx.model.seq_length,
        pre_process=pre_process, post_process=post_process,
        share_embeddings_and_output_weights=not ctx.model.untie_embeddings_and_output_weights,
        pg_collection=pg_collection(ctx, strategy), vp_stage=vp_stage,
        **models.position_embedding_args(ctx.model, ctx.settings))
    use_group_cross_entropy(shell)
    if post_process and not pre_process and shell.share_embeddings_and_output_weights:
        # The last stage's copy of the tied embedding: counted once (on the first stage) in the norm.
        shell.output_layer.weight.shared = True
    return shell, config


def _rotary(ctx: BuildContext, config):
    """The decoder's own RoPE table (rope models): stages without the GPT shell need one too,
    and it does not depend on the layout, since attention sees the whole sequence. None under multi-latent
    attention, which rotates its queries and keys itself (and asserts it is handed no table)."""
    if ctx.model.position_embedding_type != "rope" or config.multi_latent_attention:
        return None
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    return RotaryEmbedding(kv_channels=config.kv_channels, rotary_percent=ctx.settings.rotary_percent,
                           rotary_interleaved=config.rotary_interleaved, rotary_base=ctx.model.rotary_base,
                           use_cpu_initialization=config.use_cpu_initialization)


def part_rng(ctx: BuildContext, strategy: LayerStrategy, part_index: int) -> PartRng:
    """The dropout stream of a part: seeded from this rank's TP rank in the part's own layout."""
    stage_seed = ctx.settings.seed + 100 * ctx.pgs.stage  # runtime.model.set_random_seed's stage seed
    return PartRng(part_seed(stage_seed, ctx.pgs.local_rank % strategy.tp, part_index))


def build_chunk(ctx: BuildContext, chunk_index: int, vp_stage) -> HybridChunk:
    """The HybridChunk of plan chunk `chunk_index` on this rank."""
    plan = ctx.plan
    first, last = chunk_index == 0, chunk_index == len(plan.chunks) - 1
    segments = chunk_segments(plan, chunk_index)
    built = [_segment(ctx, seg, last and index == len(segments) - 1) for index, seg in enumerate(segments)]
    boundary = boundary_strategy(plan, ctx.model.seq_length) if plan.pipeline_parallel > 1 else plan.embedding
    rngs = [part_rng(ctx, seg.strategy, seg.first + 1) for seg in segments]
    blocks = [block for block, _ in built]  # fully_shard (ZeRO-3) wraps a block in place
    decoder = HybridDecoder(blocks, [s.strategy for s in segments], plan.embedding if first else boundary,
                            plan.embedding if last else boundary, ctx.pgs, rngs,
                            rotary=_rotary(ctx, built[0][1]) if built else None)
    members = [(block, seg.strategy, config, False) for (block, config), seg in zip(built, segments)]
    shell, config = None, hconfigs.segment_config(ctx.model, plan, plan.embedding, ctx.settings, ctx.backend)
    if first or last:
        shell, config = _shell(ctx, first, last, vp_stage)
        attach(shell, decoder)
        members.insert(0, (shell, plan.embedding, config, True))
    wrapped = wrap_parts(ctx, members)
    shell_rng = part_rng(ctx, plan.embedding, 0) if shell is not None else None
    shell_groups = (ctx.pgs.tp(plan.embedding), ctx.pgs.dp(plan.embedding)) if shell is not None else (None, None)
    block_groups = ([ctx.pgs.tp(seg.strategy) for seg in segments], [ctx.pgs.dp(seg.strategy) for seg in segments])
    return HybridChunk(hconfigs.schedule_config(config, plan, ctx.backend), shell, blocks, decoder, wrapped,
                       shell_groups=shell_groups, block_groups=block_groups, shell_rng=shell_rng)


def build_model(plan: Plan, model: ModelSpec, settings: TrainSettings, backend: str, device: torch.device,
                pgs: HybridProcessGroups) -> list[HybridChunk]:
    """This rank's chunks, one per virtual stage."""
    padded_vocab = configs.padded_vocab_size(settings.data.vocab_size, settings, plan.embedding.tp)
    ctx = BuildContext(plan, model, settings, backend, device, pgs, padded_vocab)
    indices = stage_chunk_indices(plan, pgs.stage)
    virtual = plan.virtual_stages > 1
    return [build_chunk(ctx, index, vp if virtual else None) for vp, index in enumerate(indices)]
