"""Throughput arithmetic and Megatron-style log lines."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..specs.model import ModelSpec


def model_flops_per_iteration(model: ModelSpec, global_batch_size: int, padded_vocab: int) -> float:
    """Model FLOPs of one iteration, forward + backward, excluding recomputation.

    Narayanan et al. SC21, eq. (3) without the recompute pass: per layer and
    token, 2 FLOPs per matmul weight plus 4*s*h for the attention scores and
    values; 2*h*V for the logits; backward is twice the forward. For GPT this is
    72*B*s*l*h^2 * (1 + s/(6h) + V/(12*l*h)). Multi-token prediction depths add what Megatron-LM adds.
    """
    s, h, depths = model.seq_length, model.hidden_size, model.mtp_num_layers
    forward_per_token = 0.0
    for layer in (*model.layers, *(model.mtp_layer,) * depths):
        kv = layer.kv_channels
        qkv_out = (layer.num_attention_heads + 2 * layer.num_query_groups) * kv
        matmul_weights = layer.hidden_size * qkv_out + layer.attention_width * layer.hidden_size \
            + mlp_weights_per_token(layer)
        forward_per_token += 2 * matmul_weights + 4 * s * layer.attention_width  # a*d = h unless --kv-channels
    # Multi-token prediction as Megatron-LM's num_floating_point_operations counts it: each depth's layer (above),
    # its three norms and 2h -> h projection, and one more pass through the output layer.
    forward_per_token += depths * 2 * (3 * h + 2 * h * h)
    forward_per_token += 2 * h * padded_vocab * (1 + depths)
    return 3.0 * forward_per_token * s * global_batch_size


def mlp_weights_per_token(layer) -> int:
    """MLP weights one token multiplies by: the dense MLP's, or for a MoE layer the router's (h x E), its
    top-k experts' and the shared expert's (a routed token passes k experts; Fedus et al. 2022, sec. 2)."""
    def mlp(width: int) -> int:
        return layer.hidden_size * width * (3 if layer.swiglu else 2)

    if layer.moe is None:
        return mlp(layer.ffn_hidden_size)
    moe = layer.moe
    return (layer.hidden_size * moe.num_experts + moe.router_topk * mlp(moe.expert_ffn_hidden_size)
            + mlp(moe.shared_expert_ffn_hidden_size))


@dataclass(frozen=True)
class IterationLog:
    """The numbers of one Megatron-style log line."""

    iteration: int
    train_iters: int
    consumed_samples: int
    elapsed_s: float
    """Mean seconds per iteration over the logging interval."""
    learning_rate: float
    global_batch_size: int
    loss: float
    grad_norm: float
    tokens_per_s: float
    tflops_per_gpu: float
    skipped: int = 0
    loss_scale: Optional[float] = None
    """fp16 only: the current loss scale (Megatron-LM logs it after the loss)."""
    extra_losses: tuple[tuple[str, float], ...] = ()
    """MoE models: the routers' auxiliary losses, logged after the lm loss as Megatron-LM does."""


def format_iteration(log: IterationLog) -> str:
    """`iteration N/ M | ... | lm loss: X.XXXXXXE+00 | ...`, as Megatron-LM's training_log writes it."""
    return (
        f" iteration {log.iteration:8d}/{log.train_iters:8d} |"
        f" consumed samples: {log.consumed_samples:12d} |"
        f" elapsed time per iteration (ms): {log.elapsed_s * 1000:.1f} |"
        f" throughput per GPU (TFLOP/s/GPU): {log.tflops_per_gpu:.4f} |"
        f" tokens per second: {log.tokens_per_s:.1f} |"
        f" learning rate: {log.learning_rate:.6E} |"
        f" global batch size: {log.global_batch_size:5d} |"
        f" lm loss: {log.loss:.6E} |"
        + "".join(f" {name}: {value:.6E} |" for name, value in log.extra_losses)
        + (f" loss scale: {log.loss_scale:.1f} |" if log.loss_scale is not None else "")
        + f" grad norm: {log.grad_norm:.6f} |"
        f" number of skipped iterations: {log.skipped:3d} |"
    )


def format_eval(iteration: int, loss: float, where: str = "") -> str:
    """Megatron's validation line; `where` follows the iteration (e.g. " on validation set")."""
    import math

    ppl = math.exp(min(20.0, loss))
    return (f" validation loss at iteration {iteration}{where} | lm loss value: {loss:.6E} |"
            f" lm loss PPL: {ppl:.6E} |")
