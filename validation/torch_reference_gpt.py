"""A plain PyTorch GPT: what a user writes without Megatron, the reference of validation/bench_gpu_vs_torch.py.

The same shape as the runtime's GPT (learned positions, pre-LayerNorm blocks,
fused QKV projection, 4h GELU MLP, tied input and output embeddings), with
torch's scaled_dot_product_attention (FlashAttention on CUDA for bf16), run in
eager mode. Mixed precision is autocast over fp32 master weights; the optimizer
is AdamW, fused on CUDA (`make_optimizer`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GptShape:
    """The model's sizes, in Megatron's names."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    vocab_size: int
    dropout: float = 0.0
    """Attention and hidden dropout (the benchmark runs both models without)."""


class Block(nn.Module):
    """One pre-LayerNorm Transformer layer."""

    def __init__(self, shape: GptShape):
        super().__init__()
        h = shape.hidden_size
        self.heads, self.dropout = shape.num_attention_heads, shape.dropout
        self.attention_norm, self.mlp_norm = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.attention_out = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.mlp_in, self.mlp_out = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).view(batch, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        dropout = self.dropout if self.training else 0.0
        context = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        x = x + F.dropout(self.attention_out(context.transpose(1, 2).reshape(batch, seq, hidden)), dropout)
        return x + F.dropout(self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(x)))), dropout)


class ReferenceGpt(nn.Module):
    """Embeddings, the blocks, a final LayerNorm and the tied output projection; returns the mean loss."""

    def __init__(self, shape: GptShape, init_std: float = 0.02):
        super().__init__()
        self.token_embedding = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.position_embedding = nn.Embedding(shape.seq_length, shape.hidden_size)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.num_layers))
        self.final_norm = nn.LayerNorm(shape.hidden_size)
        for module in self.modules():  # Megatron's init: N(0, 0.02) weights, zero biases
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=init_std)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.final_norm(x) @ self.token_embedding.weight.t()
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def make_optimizer(model: nn.Module, lr: float = 1e-4, weight_decay: float = 0.01) -> torch.optim.AdamW:
    """AdamW, one fused kernel per step on CUDA (torch's multi-tensor foreach path on CPU)."""
    on_cuda = next(model.parameters()).is_cuda
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=on_cuda,
                             foreach=not on_cuda)


def train_step(model: ReferenceGpt, optimizer: torch.optim.Optimizer, shape: GptShape, micro_batch: int,
               global_batch: int, precision: str, generator: torch.Generator) -> float:
    """One iteration over `global_batch` samples in micro-batches; gradient clipping at 1.0 as the
    runtime does. Returns the mean loss."""
    device = next(model.parameters()).device
    micro_batches = global_batch // micro_batch
    total = 0.0
    for _ in range(micro_batches):
        tokens = torch.randint(0, shape.vocab_size, (micro_batch, shape.seq_length + 1), generator=generator)
        tokens = tokens.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(tokens[:, :-1], tokens[:, 1:]) / micro_batches
        loss.backward()
        total += loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(total)


def resident_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes the model holds between iterations: weights and optimizer states (gradients are freed)."""
    tensors = list(model.parameters())
    tensors += [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors)
