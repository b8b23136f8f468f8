"""The model of a hybrid plan on one rank: per-segment TransformerBlocks between a GPT shell.

The embedding and LM head live in a `GPTModel` built with the embedding's own
layout and no decoder layers (the "shell"); its decoder is replaced by a
`HybridDecoder` that re-lays activations out between segments. The parts of a
chunk with one layout (TP, DP, SP, ZeRO 0/1) share one Megatron DDP over their
data-parallel group (`build.wrap_parts`), so a segment's gradients are reduced
(or reduce-scattered, ZeRO-1) only among the ranks that replicate it, and a
uniform plan runs the stock runtime's collectives; ZeRO-3 segments are FSDP2
parts of their own (`sharded.py`).
"""
from __future__ import annotations

import contextlib

import torch

from ...plan import LayerStrategy
from .relayout import relayout
from .segments import Segment


class HybridDecoder(torch.nn.Module):
    """Segments in order, with a re-layout before each and one to the output layout at the end.

    Holds the segment modules *unregistered* (see `attach`), so the shell's DDP
    and optimizer never see their parameters.
    """

    def __init__(self, segments: list, strategies: list[LayerStrategy], input_strategy: LayerStrategy,
                 output_strategy: LayerStrategy, pgs, rngs: list | None = None, rotary=None) -> None:
        super().__init__()
        self.rotary = rotary
        """RotaryEmbedding of a rope model (None otherwise): every block gets its table."""
        self.__dict__["segment_modules"] = segments
        self.strategies = strategies
        self.rngs = rngs if rngs is not None else [None] * len(segments)
        """Each segment's dropout stream (rng.PartRng), swapped in for its forward."""
        self.input_strategy, self.output_strategy = input_strategy, output_strategy
        self.pgs = pgs
        self.input_tensor = None

    def sequence_length(self, hidden_states) -> int:
        """Full sequence length of the input [s', b', h]: s' x TP under an SP input layout."""
        split = self.input_strategy.tp if self.input_strategy.sp else 1
        return hidden_states.shape[0] * split

    @property
    def layers(self) -> list:
        """Every TransformerLayer of the segments (the schedules tag them with the micro-batch)."""
        return [layer for block in self.segment_modules for layer in block.layers]

    def set_input_tensor(self, tensor) -> None:
        self.input_tensor = tensor

    def forward(self, hidden_states=None, attention_mask=None, **_):
        """[s', b', h] in the input layout -> [s'', b'', h] in the output layout."""
        if hidden_states is None:
            hidden_states = self.input_tensor
        current = self.input_strategy
        rope = {} if self.rotary is None else {"rotary_pos_emb": self.rotary(self.sequence_length(hidden_states))}
        for module, strategy, rng in zip(self.segment_modules, self.strategies, self.rngs):
            hidden_states = relayout(hidden_states, current, strategy, self.pgs)
            with rng.active() if rng is not None else contextlib.nullcontext():
                hidden_states = module(hidden_states=hidden_states, attention_mask=attention_mask, **rope)
            current = strategy
        return relayout(hidden_states, current, self.output_strategy, self.pgs)


def attach(shell, decoder: HybridDecoder) -> None:
    """Put `decoder` in the shell's forward path without registering it as a submodule."""
    if "decoder" in shell._modules:
        del shell._modules["decoder"]
    shell.__dict__["decoder"] = decoder


class HybridChunk(torch.nn.Module):
    """What Megatron's schedules see as one model chunk: forward, set_input_tensor, config.

    `shell` and `segments` are the raw modules the forward runs; `wrapped` are the
    DDP/FSDP parts that own their gradients (parts of one layout share one DDP).
    """

    def __init__(self, config, shell, segments: list, decoder: HybridDecoder, wrapped: list,
                 shell_groups=(None, None), block_groups=((), ()), shell_rng=None) -> None:
        from megatron.core.enums import ModelType

        super().__init__()
        self.config = config
        self.model_type = ModelType.encoder_or_decoder
        # Only the wrapped parts are registered: they hold every module once, so train()/eval()
        # walk each module once (the shell and blocks are also reachable through them).
        self.__dict__["shell"], self.__dict__["segments"] = shell, list(segments)
        self.__dict__["decoder"] = decoder
        self.shell_rng = shell_rng
        """The embedding/head's dropout stream (rng.PartRng), or None."""
        self.shell_tp_group, self.shell_dp_group = shell_groups
        self.block_tp_groups, self.block_dp_groups = (list(groups) for groups in block_groups)
        """TP and DP groups of the shell and of each segment (loading full weights cuts by TP; a checkpoint
        writes one replica per DP group)."""
        self.parts = torch.nn.ModuleList([part for part, _ in wrapped])
        self.wrapped = [part for part, _ in wrapped]
        """Every DDP/FSDP-wrapped part of this chunk."""
        self.wrapped_strategies = [strategy for _, strategy in wrapped]
        """The layout of each wrapped part (its DP group and optimizer sharding)."""

    def set_input_tensor(self, input_tensor) -> None:
        tensor = input_tensor[0] if isinstance(input_tensor, (list, tuple)) else input_tensor
        self.decoder.set_input_tensor(tensor)

    def forward(self, input_ids, position_ids, attention_mask, labels=None):
        if self.shell is not None:
            with self.shell_rng.active() if self.shell_rng is not None else contextlib.nullcontext():
                output = self.shell(input_ids, position_ids, attention_mask, labels=labels)
            # The last stage's 16-bit outputs to fp32, as Megatron's Float16Module does.
            return output.float() if self.shell.post_process and output.dtype != torch.float32 else output
        return self.decoder()

    def zero_grad_buffer(self) -> None:
        for part in self.wrapped:
            part.zero_grad_buffer()

    def no_sync(self):
        return _AllNoSync(self.wrapped)


class _AllNoSync:
    """Enter every part's no_sync context (gradient accumulation across micro-batches)."""

    def __init__(self, parts) -> None:
        self.contexts = [part.no_sync() for part in parts]

    def __enter__(self):
        for context in self.contexts:
            context.__enter__()

    def __exit__(self, *exc):
        for context in reversed(self.contexts):
            context.__exit__(*exc)
        return False


def segment_block(config, spec_submodules, segment: Segment, post_process: bool, pg_collection):
    """A TransformerBlock of the segment's layers (final layernorm when it ends the model), numbered as
    the model's layers `segment.first + 1 ...` (a MoE router logs its losses under its layer's number)."""
    from megatron.core.transformer.transformer_block import TransformerBlock

    block = TransformerBlock(config=config, spec=spec_submodules, pre_process=True, post_process=post_process,
                             post_layer_norm=post_process, pg_collection=pg_collection)
    for offset, layer in enumerate(block.layers):
        layer.layer_number = segment.first + offset + 1
        if hasattr(layer.mlp, "set_layer_number"):
            layer.mlp.set_layer_number(layer.layer_number)
    return block
