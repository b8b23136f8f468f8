"""ModelSpec: a GPT/LLaMA-style decoder described layer by layer.

A model file may use Megatron's own flag names (the compact form), e.g.
`{"num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96,
"seq_length": 2048, "vocab_size": 51200}`, or list its layers (the rich form,
what `to_dict` writes), so that models whose layers differ can be described.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Optional

from .. import serde
from ..serde import CachedHash
from ..errors import UserError
from ..limits import MAX_LAYERS

MODEL_SCHEMA_VERSION = 1
NORMALIZATIONS = ("LayerNorm", "RMSNorm")
SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
"""Megatron-Core's TransformerConfig.softmax_type values."""
POSITION_EMBEDDINGS = ("learned_absolute", "rope", "none")
LOAD_BALANCING_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")


@dataclass(frozen=True)
class MoESpec(CachedHash):
    """The mixture-of-experts MLP of one layer (replaces the dense MLP); Megatron-LM's flag names in brackets."""

    __hash__ = CachedHash.__hash__  # dataclass(frozen=True) would otherwise replace it

    num_experts: int
    """Routed experts, E [--num-experts]."""
    router_topk: int = 2
    """Experts each token is sent to, k [--moe-router-topk]."""
    expert_ffn_hidden_size: Optional[int] = None
    """Inner width of one expert [--moe-ffn-hidden-size]; None (in a file) means the layer's ffn_hidden_size."""
    shared_expert_ffn_hidden_size: int = 0
    """Inner width of the shared expert(s) every token passes [--moe-shared-expert-intermediate-size]; 0 = none."""
    router_load_balancing_type: str = "aux_loss"
    """aux_loss, seq_aux_loss, global_aux_loss, sinkhorn or none [--moe-router-load-balancing-type]."""
    aux_loss_coeff: float = 0.0
    """Weight of the load-balancing loss [--moe-aux-loss-coeff]."""
    z_loss_coeff: float = 0.0
    """Weight of the router z-loss [--moe-z-loss-coeff]."""
    router_num_groups: int = 0
    """Group-limited routing: the experts form this many equal groups [--moe-router-num-groups]; 0 = none."""
    router_group_topk: int = 0
    """Groups each token's experts may come from [--moe-router-group-topk] (DeepSeek-V3: 4 of 8)."""

    def __post_init__(self) -> None:
        _check_positive(self, "num_experts", "router_topk")
        if self.router_topk > self.num_experts:
            raise ValueError(f"moe_router_topk {self.router_topk} exceeds num_experts {self.num_experts}")
        if self.expert_ffn_hidden_size is not None:
            _check_positive(self, "expert_ffn_hidden_size")
        if not isinstance(self.shared_expert_ffn_hidden_size, int) or self.shared_expert_ffn_hidden_size < 0:
            raise ValueError(f"shared_expert_ffn_hidden_size must be a non-negative integer, "
                             f"got {self.shared_expert_ffn_hidden_size!r}")
        if self.router_load_balancing_type not in LOAD_BALANCING_TYPES:
            raise ValueError(f"router_load_balancing_type must be one of {', '.join(LOAD_BALANCING_TYPES)}, "
                             f"got {self.router_load_balancing_type!r}")
        self._check_groups()
        for name in ("aux_loss_coeff", "z_loss_coeff"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")

    def _check_groups(self) -> None:
        """Megatron-Core's checks on group-limited routing (transformer_config.py, moe/moe_utils.py)."""
        groups, topk = self.router_num_groups, self.router_group_topk
        if not groups and not topk:
            return
        if not (isinstance(groups, int) and isinstance(topk, int) and 0 < topk <= groups):
            raise ValueError(f"group-limited routing needs moe_router_num_groups and moe_router_group_topk with "
                             f"0 < group_topk <= num_groups, got {groups!r} and {topk!r}")
        if self.num_experts % groups or self.router_topk > topk * (self.num_experts // groups):
            raise ValueError(f"{self.num_experts} experts do not form {groups} groups that can hold "
                             f"moe_router_topk {self.router_topk} experts in {topk} of them")

    def mlp_parameters(self, hidden_size: int, swiglu: bool, bias: bool) -> int:
        """Router (E x h, plus E biases), E experts and the shared expert, each an MLP of Megatron's layout."""
        router = self.num_experts * hidden_size + (self.num_experts if bias else 0)
        experts = self.num_experts * mlp_parameters(hidden_size, self.expert_ffn_hidden_size, swiglu, bias)
        shared = mlp_parameters(hidden_size, self.shared_expert_ffn_hidden_size, swiglu, bias)
        return router + experts + (shared if self.shared_expert_ffn_hidden_size else 0)


@dataclass(frozen=True)
class MLASpec(CachedHash):
    """Multi-latent attention (DeepSeek-V2, Liu et al. 2024, arXiv 2405.04434, Sec. 2.1) as Megatron-Core's
    MLASelfAttention builds it; Megatron-LM's flag names in brackets. Keys and values come from one latent of
    kv_lora_rank channels per token (up-projected to every head), queries from the hidden state or from a
    q_lora_rank latent; each head's query and key carry qk_head_dim channels without position and
    qk_pos_emb_head_dim rotated ones (the key's rotated part is shared by all heads)."""

    __hash__ = CachedHash.__hash__  # dataclass(frozen=True) would otherwise replace it

    kv_lora_rank: int = 32
    """Width of the compressed key/value latent [--kv-lora-rank]."""
    qk_head_dim: int = 128
    """Query/key channels per head without position [--qk-head-dim]."""
    qk_pos_emb_head_dim: int = 64
    """Query/key channels per head that RoPE rotates [--qk-pos-emb-head-dim]."""
    v_head_dim: int = 128
    """Value channels per head [--v-head-dim]."""
    q_lora_rank: Optional[int] = None
    """Width of the compressed query latent [--q-lora-rank]; None: the query is projected from the hidden state."""

    def __post_init__(self) -> None:
        _check_positive(self, "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
        if self.q_lora_rank is not None:
            _check_positive(self, "q_lora_rank")

    @property
    def query_head_width(self) -> int:
        """Channels of one head's query and key: qk_head_dim + qk_pos_emb_head_dim."""
        return self.qk_head_dim + self.qk_pos_emb_head_dim

    def projection_parameters(self, hidden_size: int, heads: int) -> int:
        """The weights in front of the core (all without bias): the query's projection (h x a dq, or the down
        projection h x q_lora and the up projection q_lora x a dq), the key/value down projection
        h x (kv_lora + dr) and its up projection kv_lora x a (dk + dv)."""
        query_out = heads * self.query_head_width
        if self.q_lora_rank is None:
            query = hidden_size * query_out
        else:
            query = hidden_size * self.q_lora_rank + self.q_lora_rank * query_out
        kv_down = hidden_size * (self.kv_lora_rank + self.qk_pos_emb_head_dim)
        kv_up = self.kv_lora_rank * heads * (self.qk_head_dim + self.v_head_dim)
        return query + kv_down + kv_up

    def latent_widths(self) -> tuple[int, ...]:
        """Widths of the latents the down projections make (q_lora_rank if any, kv_lora_rank + dr): Megatron's
        local spec builds those projections column-parallel, so TP must divide each."""
        kv = self.kv_lora_rank + self.qk_pos_emb_head_dim
        return (kv,) if self.q_lora_rank is None else (self.q_lora_rank, kv)

    def latent_norm_widths(self) -> tuple[int, ...]:
        """Widths the latent norms run over under --qk-layernorm (q_lora_rank if any, kv_lora_rank)."""
        return (self.kv_lora_rank,) if self.q_lora_rank is None else (self.q_lora_rank, self.kv_lora_rank)


def mlp_parameters(hidden_size: int, ffn_hidden_size: int, swiglu: bool, bias: bool) -> int:
    """One MLP: fc1 (h x f, doubled for SwiGLU's gate) and fc2 (f x h), with their biases when `bias`."""
    fc1_out = ffn_hidden_size * (2 if swiglu else 1)
    weights = hidden_size * fc1_out + ffn_hidden_size * hidden_size
    return weights + ((fc1_out + hidden_size) if bias else 0)


def parse_moe_layer_freq(text: str) -> "int | list[int]":
    """Megatron-LM's --moe-layer-freq text: an integer N, or a Python list expression of 0/1 such as
    `([0]*1+[1]*27)` or `[1,1,0]*2` (megatron/training/arguments.py evaluates it; here only list literals,
    integers, + and * are accepted). ValueError for anything else."""
    import ast

    def value(node: ast.AST):
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.List):
            return [value(item) for item in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Mult) and isinstance(left, list) == isinstance(right, list):
                raise ValueError("'*' needs a list and an integer")
            if isinstance(node.op, ast.Add):
                return left + right
            items, count = (left, right) if isinstance(left, list) else (right, left)
            if not 0 <= count * len(items) <= MAX_LAYERS:  # before building it
                raise ValueError(f"a list of {count * len(items)} layers")
            return items * count
        raise ValueError(f"unsupported element {ast.dump(node)[:40]}")

    try:
        parsed = value(ast.parse(text.strip(), mode="eval").body) if len(text) <= 10000 else None
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError) as error:
        raise ValueError(f"moe_layer_freq {text!r} is not an integer or a list expression of 0/1 ({error})") from None
    if parsed is None or isinstance(parsed, list) and len(parsed) > MAX_LAYERS:
        raise ValueError(f"moe_layer_freq {text[:40]!r}... describes more than {MAX_LAYERS} layers")
    return parsed


def moe_layer_pattern(freq: "int | list | tuple", num_layers: int) -> tuple[bool, ...]:
    """Which layers are MoE, by Megatron's --moe-layer-freq (megatron/training/arguments.py,
    TransformerConfig.moe_layer_freq): an int N makes layer i MoE iff i % N == 0; a list gives 0/1 per layer."""
    if isinstance(freq, str):
        freq = parse_moe_layer_freq(freq)
    if isinstance(freq, bool) or not isinstance(freq, (int, list, tuple)):
        raise ValueError(f"moe_layer_freq must be an integer or a list of 0/1 per layer, got {freq!r}")
    if isinstance(freq, int):
        if freq < 1:
            raise ValueError(f"moe_layer_freq must be a positive integer, got {freq}")
        return tuple(i % freq == 0 for i in range(num_layers))
    if len(freq) != num_layers:
        raise ValueError(f"moe_layer_freq lists {len(freq)} layers but the model has {num_layers}")
    if any(isinstance(x, bool) or x not in (0, 1) for x in freq):
        raise ValueError(f"moe_layer_freq entries must be 0 or 1, got {list(freq)!r}")
    return tuple(x == 1 for x in freq)


@dataclass(frozen=True)
class LayerSpec(CachedHash):
    """One transformer decoder layer (self-attention + MLP)."""

    __hash__ = CachedHash.__hash__  # dataclass(frozen=True) would otherwise replace it

    hidden_size: int
    """Width of the residual stream, h."""
    num_attention_heads: int
    """Query heads, a."""
    num_query_groups: int
    """Key/value heads (GQA groups); equal to the heads for plain multi-head attention."""
    ffn_hidden_size: int
    """Inner width of the MLP."""
    swiglu: bool = False
    """Gated SwiGLU MLP (three weight matrices) instead of GeLU (two)."""
    squared_relu: bool = False
    """The MLP's activation is ReLU(x)^2 (Megatron's --squared-relu, Nemotron) in place of GeLU: the same two
    matrices, the same kept tensors (fc1's output and the activation's), so the same costs."""
    normalization: str = "LayerNorm"
    """LayerNorm (weight and bias) or RMSNorm (weight only), Megatron's --normalization."""
    add_bias_linear: bool = True
    """Biases on the linear layers; False is Megatron's --disable-bias-linear (LLaMA)."""
    kv_channels: Optional[int] = None
    """Width of one attention head, d (Megatron's --kv-channels); None (in a file) means h / a."""
    add_qkv_bias: bool = False
    """A bias on the QKV projection even without the other linear biases (Megatron's --add-qkv-bias, Qwen)."""
    qk_layernorm: bool = False
    """A norm over each query and key head before the scores (Megatron's --qk-layernorm)."""
    apply_layernorm_1p: bool = False
    """Norm weights stored as gamma - 1, zero-initialised (Megatron's --apply-layernorm-1p); costs nothing."""
    rotary: bool = False
    """The attention rotates Q and K (RoPE): set from the model's position_embedding_type by ModelSpec, since
    the rotated copies change what the layer keeps for backward (cost.memory.qkv_kept_width)."""
    moe: Optional[MoESpec] = None
    """The mixture-of-experts MLP that replaces the dense one (its experts use swiglu and add_bias_linear);
    None: a dense MLP of ffn_hidden_size."""
    mla: Optional[MLASpec] = None
    """Multi-latent attention in place of the QKV projection (Megatron's --multi-latent-attention): its heads
    are all key/value heads (num_query_groups = num_attention_heads), --qk-layernorm norms its latents, and
    kv_channels is unused; None: Megatron's SelfAttention."""
    hidden_dropout: float = 0.1
    """Dropout after the attention and the MLP and on the embedding [--hidden-dropout, Megatron-LM's default
    0.1]: at 0 no mask is drawn or kept (ATen's dropout returns its input when p == 0)."""
    attention_dropout: float = 0.1
    """Dropout on the attention probabilities [--attention-dropout, default 0.1]; at 0 the unfused core keeps
    no s x s mask."""
    attention_window: Optional[int] = None
    """Sliding-window attention: each query attends to itself and this many keys before it (Megatron-Core's
    window_size[0], with window_size[1] = 0; GPT-OSS: 127 on every other layer); None: the whole causal prefix."""
    softmax_type: str = "vanilla"
    """The attention's softmax [Megatron-Core's softmax_type]: vanilla, off-by-one (a zero logit beside the keys)
    or learnable (one learned logit a head, GPT-OSS's sinks: num_attention_heads weights); one more logit a row
    costs the core nothing measurable, but Transformer Engine runs it on its fused (cuDNN) attention only, and
    under context parallelism with cp_comm_type a2a only (cost/context_parallel.py, cp_comm_problem)."""

    def __post_init__(self) -> None:
        _check_positive(self, "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size")
        if self.attention_window is not None and self.attention_window < 0:
            raise ValueError(f"attention_window must be at least 0, got {self.attention_window}")
        if self.softmax_type not in SOFTMAX_TYPES:
            raise ValueError(f"softmax_type must be one of {', '.join(SOFTMAX_TYPES)}, got {self.softmax_type!r}")
        if self.swiglu and self.squared_relu:
            raise ValueError("swiglu and squared_relu are two activations: give one")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1), got {getattr(self, name)}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {', '.join(NORMALIZATIONS)}, got {self.normalization!r}")
        if self.kv_channels is None:
            # Megatron-LM's validate_args: without --kv-channels, heads must divide the width.
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                                 f"{self.num_attention_heads} (or give kv_channels)")
            object.__setattr__(self, "kv_channels", self.hidden_size // self.num_attention_heads)
        _check_positive(self, "kv_channels")
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not divisible by num_query_groups {self.num_query_groups}")
        if self.mla is not None:
            _check_mla_layer(self)
        if self.moe is not None and self.moe.expert_ffn_hidden_size is None:
            # Megatron-Core's TransformerConfig: moe_ffn_hidden_size defaults to ffn_hidden_size.
            object.__setattr__(self, "moe", replace(self.moe, expert_ffn_hidden_size=self.ffn_hidden_size))

    @property
    def is_moe(self) -> bool:
        """Whether the MLP is a mixture of experts."""
        return self.moe is not None

    @property
    def dense_ffn_hidden_size(self) -> int:
        """Inner width of the MLP that every token passes under the layer's TP: ffn_hidden_size, or for a
        MoE layer its shared expert's (0 without one); the routed experts are priced by cost/moe.py."""
        return self.ffn_hidden_size if self.moe is None else self.moe.shared_expert_ffn_hidden_size

    @property
    def dense_parameters(self) -> int:
        """Weights outside the routed experts (what the layer's TP/DP/ZeRO layout holds)."""
        return self.num_parameters - self.expert_parameters

    @property
    def query_head_width(self) -> int:
        """Channels of one head's query and key: d, or MLA's qk_head_dim + qk_pos_emb_head_dim."""
        return self.kv_channels if self.mla is None else self.mla.query_head_width

    @property
    def value_head_width(self) -> int:
        """Channels of one head's value (and of its attention output): d, or MLA's v_head_dim."""
        return self.kv_channels if self.mla is None else self.mla.v_head_dim

    @property
    def attention_width(self) -> int:
        """Width of the attention output, a x d_v (the output projection's input; h when d = h / a)."""
        return self.num_attention_heads * self.value_head_width

    @property
    def has_qkv_bias(self) -> bool:
        """Whether the QKV projection has a bias (Megatron: add_bias_linear or add_qkv_bias); MLA's
        projections have none."""
        return self.mla is None and (self.add_bias_linear or self.add_qkv_bias)

    def tensor_parallel_error(self, tp: int) -> Optional[str]:
        """Why Megatron-Core cannot split this layer over `tp` ranks (heads, query groups, MLA's latents and
        the MoE layer's dense width divide by TP), or None."""
        if self.num_attention_heads % tp or self.num_query_groups % tp:
            return (f"tp={tp} does not divide the attention heads ({self.num_attention_heads}) and query groups "
                    f"({self.num_query_groups})")
        widths = self.mla.latent_widths() if self.mla is not None else ()
        if any(width % tp for width in widths):
            listed = ", ".join(map(str, widths))
            return f"tp={tp} does not divide the multi-latent attention's latent widths ({listed})"
        return None

    @property
    def norm_parameters(self) -> int:
        """One norm's weights: scale and shift for LayerNorm, scale only for RMSNorm."""
        return self.hidden_size * (2 if self.normalization == "LayerNorm" else 1)

    @property
    def num_parameters(self) -> int:
        """Weights and biases of the layer (Megatron's layout: QKV, proj, MLP or MoE, two norms, the q/k norms of
        --qk-layernorm, each over one head's d channels, and a learnable softmax's one offset a head)."""
        h, kv = self.hidden_size, self.kv_channels
        output = self.attention_width * h + (h if self.add_bias_linear else 0)
        norm_weights = 2 if self.normalization == "LayerNorm" else 1
        sinks = self.num_attention_heads if self.softmax_type == "learnable" else 0  # core_attention.softmax_offset
        if self.mla is not None:
            projections = self.mla.projection_parameters(h, self.num_attention_heads)
            qk_norms = norm_weights * sum(self.mla.latent_norm_widths()) if self.qk_layernorm else 0
            return projections + output + self.mlp_parameters + 2 * self.norm_parameters + qk_norms + sinks
        qkv_out = (self.num_attention_heads + 2 * self.num_query_groups) * kv
        attention = h * qkv_out + output + (qkv_out if self.has_qkv_bias else 0)
        qk_norms = 2 * kv * norm_weights if self.qk_layernorm else 0
        return attention + self.mlp_parameters + 2 * self.norm_parameters + qk_norms + sinks

    @property
    def mlp_parameters(self) -> int:
        """The MLP's weights and biases: the dense MLP, or the router, experts and shared expert."""
        if self.moe is not None:
            return self.moe.mlp_parameters(self.hidden_size, self.swiglu, self.add_bias_linear)
        return mlp_parameters(self.hidden_size, self.ffn_hidden_size, self.swiglu, self.add_bias_linear)

    @property
    def expert_parameters(self) -> int:
        """Weights of the routed experts (what expert parallelism shards); 0 for a dense layer."""
        if self.moe is None:
            return 0
        return self.moe.num_experts * mlp_parameters(self.hidden_size, self.moe.expert_ffn_hidden_size,
                                                     self.swiglu, self.add_bias_linear)


@dataclass(frozen=True)
class ModelSpec(CachedHash):
    """A decoder-only language model: embedding, layers, final norm, LM head."""

    __hash__ = CachedHash.__hash__  # dataclass(frozen=True) would otherwise replace it

    name: str
    """Preset name or a label of the user's choosing."""
    layers: tuple[LayerSpec, ...]
    """The decoder layers in order."""
    seq_length: int
    """Tokens per sample, s."""
    vocab_size: int
    """Vocabulary size, V (padded by the runtime as Megatron pads it)."""
    untie_embeddings_and_output_weights: bool = False
    """True when the LM head has its own weight matrix."""
    position_embedding_type: str = "learned_absolute"
    """learned_absolute (a learned s x h table), rope (rotary, no weights) or none; Megatron's flag."""
    rotary_base: int = 10000
    """RoPE's base (Megatron's --rotary-base; LLaMA-3 uses 500000)."""
    mtp_num_layers: int = 0
    """Multi-token prediction depths D [--mtp-num-layers] (DeepSeek-V3, arXiv 2412.19437, Sec. 2.2): after the
    last layer, D modules each predict one token further; 0 = none."""
    mtp_loss_scaling_factor: float = 0.1
    """Weight of the mean MTP loss beside the main loss [--mtp-loss-scaling-factor]."""
    schema_version: int = MODEL_SCHEMA_VERSION
    """Version of this record's layout."""

    def __post_init__(self) -> None:
        _check_version(self.schema_version, MODEL_SCHEMA_VERSION, "model spec")
        _check_positive(self, "seq_length", "vocab_size")
        _check_layer_count(len(self.layers))
        if len({layer.hidden_size for layer in self.layers}) != 1:
            raise ValueError("all layers must share one hidden_size (the residual stream)")
        if self.position_embedding_type not in POSITION_EMBEDDINGS:
            raise ValueError(f"position_embedding_type must be one of {', '.join(POSITION_EMBEDDINGS)}, "
                             f"got {self.position_embedding_type!r}")
        _check_positive(self, "rotary_base")
        _check_mtp(self.mtp_num_layers, self.mtp_loss_scaling_factor)
        if self.mtp_num_layers and self.position_embedding_type == "learned_absolute":
            raise ValueError("multi-token prediction needs rope or no position embeddings, not learned_absolute "
                             "(Megatron-LM's validate_args)")
        rotary = self.position_embedding_type == "rope"
        if any(layer.rotary != rotary for layer in self.layers):
            object.__setattr__(self, "layers", tuple(replace(layer, rotary=rotary) for layer in self.layers))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return self.layers[0].hidden_size

    @property
    def embedding_parameters(self) -> int:
        """Word plus, with learned_absolute positions, position embeddings (V*h + s*h)."""
        positions = self.seq_length if self.position_embedding_type == "learned_absolute" else 0
        return (self.vocab_size + positions) * self.hidden_size

    @property
    def num_parameters(self) -> int:
        head = self.vocab_size * self.hidden_size if self.untie_embeddings_and_output_weights else 0
        final_norm = self.layers[-1].norm_parameters
        layers = sum(l.num_parameters for l in self.layers) + self.mtp_num_layers * self.mtp_module_parameters
        return self.embedding_parameters + layers + final_norm + head

    @property
    def mtp_layer(self) -> LayerSpec:
        """The transformer layer inside each MTP module: a copy of the last decoder layer's shape
        (Megatron-Core gpt_layer_specs.get_gpt_mtp_block_spec_for_backend takes `layer_specs[-1]`)."""
        return self.layers[-1]

    @property
    def mtp_module_parameters(self) -> int:
        """One MTP module without the embedding and output head it shares with the model: its transformer layer,
        the 2h -> h projection eh_proj (no bias) and three norms (enorm, hnorm, final_layernorm), as Megatron-Core
        multi_token_prediction.MultiTokenPredictionLayer builds them."""
        h = self.hidden_size
        return self.mtp_layer.num_parameters + 2 * h * h + 3 * self.mtp_layer.norm_parameters

    @cached_property
    def distinct_layers(self) -> frozenset:
        """The different layer shapes of the model (one for most presets)."""
        return frozenset(self.layers)

    def is_uniform(self) -> bool:
        return len(self.distinct_layers) == 1


def window_pattern(window_size: "int | list | tuple | None", skip_freq: "int | list | str | None",
                   num_layers: int) -> tuple[Optional[int], ...]:
    """Each layer's attention_window from Megatron-Core's window_size and window_attn_skip_freq
    (transformer/utils.py, is_layer_window_attention): window_size is (left, right), of which only causal
    windows (right 0) are taken here, or the left size alone; no skip frequency windows every layer, an int N
    every layer whose 1-based number N does not divide, a list of 0/1 (1: windowed) the layers it marks."""
    if window_size is None:
        if skip_freq is not None:
            raise ValueError("window_attn_skip_freq needs window_size")
        return (None,) * num_layers
    sizes = [window_size, 0] if isinstance(window_size, int) else list(window_size)
    if len(sizes) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes):
        raise ValueError(f"window_size must be a size or [left, right] sizes of at least 0, got {window_size!r}")
    left, right = sizes
    if right != 0:
        raise ValueError(f"window_size {list(window_size)}: only causal windows (right size 0) are priced")
    if isinstance(skip_freq, str):
        skip_freq = parse_moe_layer_freq(skip_freq)
    if skip_freq is None:
        return (left,) * num_layers
    if isinstance(skip_freq, int):
        if skip_freq < 1:
            raise ValueError(f"window_attn_skip_freq must be a positive integer, got {skip_freq}")
        return tuple(left if number % skip_freq else None for number in range(1, num_layers + 1))
    if len(skip_freq) != num_layers:
        raise ValueError(f"window_attn_skip_freq lists {len(skip_freq)} layers but the model has {num_layers}")
    return tuple(left if flag else None for flag in skip_freq)


def uniform_model(name: str, num_layers: int, hidden_size: int, num_attention_heads: int,
                  seq_length: int, vocab_size: int, *, ffn_hidden_size: int | None = None,
                  num_query_groups: int | None = None, swiglu: bool = False,
                  untie_embeddings_and_output_weights: bool = False, normalization: str = "LayerNorm",
                  add_bias_linear: bool = True, position_embedding_type: str = "learned_absolute",
                  rotary_base: int = 10000, kv_channels: Optional[int] = None, add_qkv_bias: bool = False,
                  qk_layernorm: bool = False, apply_layernorm_1p: bool = False, mla: Optional[MLASpec] = None,
                  mtp_num_layers: int = 0, mtp_loss_scaling_factor: float = 0.1, hidden_dropout: float = 0.1,
                  attention_dropout: float = 0.1, squared_relu: bool = False, window_size=None,
                  window_attn_skip_freq=None, softmax_type: str = "vanilla", **moe_flags) -> ModelSpec:
    """A model from Megatron's flag values: its layers alike, except that with `num_experts` (and the other
    MoE flags of `moe_from_flags`) the layers that --moe-layer-freq picks have a mixture-of-experts MLP, and
    with `window_size` the layers that window_attn_skip_freq picks attend through a sliding window
    (window_pattern); `mla`: every layer's attention is multi-latent."""
    layer = LayerSpec(
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        num_query_groups=num_attention_heads if num_query_groups is None else num_query_groups,
        ffn_hidden_size=4 * hidden_size if ffn_hidden_size is None else ffn_hidden_size,
        swiglu=swiglu,
        squared_relu=squared_relu,
        normalization=normalization,
        add_bias_linear=add_bias_linear,
        kv_channels=kv_channels,
        add_qkv_bias=add_qkv_bias,
        qk_layernorm=qk_layernorm,
        apply_layernorm_1p=apply_layernorm_1p,
        mla=mla,
        hidden_dropout=hidden_dropout,
        attention_dropout=attention_dropout,
        softmax_type=softmax_type,
    )
    layers = _with_windows(_with_moe_layers(layer, num_layers, **moe_flags),
                           window_pattern(window_size, window_attn_skip_freq, num_layers))
    return ModelSpec(name=name, layers=layers, seq_length=seq_length,
                     vocab_size=vocab_size,
                     untie_embeddings_and_output_weights=untie_embeddings_and_output_weights,
                     position_embedding_type=position_embedding_type, rotary_base=rotary_base,
                     mtp_num_layers=mtp_num_layers, mtp_loss_scaling_factor=mtp_loss_scaling_factor)


def _with_windows(layers: tuple[LayerSpec, ...], windows: tuple[Optional[int], ...]) -> tuple[LayerSpec, ...]:
    """`layers` with their attention windows, one object per distinct (layer, window) as the cost caches like."""
    made: dict = {}
    return tuple(made.setdefault((id(layer), window), layer if window is None else
                                 replace(layer, attention_window=window)) for layer, window in zip(layers, windows))


def _with_moe_layers(dense: LayerSpec, num_layers: int, *, num_experts: Optional[int] = None,
                     moe_layer_freq: "int | list | tuple" = 1, **moe_flags) -> tuple[LayerSpec, ...]:
    """`num_layers` layers: `dense`, or with `num_experts` a MoE copy of it where moe_layer_pattern says."""
    if num_experts is None:
        if moe_flags or moe_layer_freq != 1:
            raise ValueError(f"MoE option(s) {', '.join(sorted(moe_flags) or ['moe_layer_freq'])} need num_experts")
        return (dense,) * num_layers
    moe_layer = replace(dense, moe=moe_from_flags(num_experts, **moe_flags))
    return tuple(moe_layer if is_moe else dense for is_moe in moe_layer_pattern(moe_layer_freq, num_layers))


def moe_from_flags(num_experts: int, *, moe_router_topk: int = 2, moe_ffn_hidden_size: Optional[int] = None,
                   moe_shared_expert_intermediate_size: Optional[int] = None,
                   moe_router_load_balancing_type: str = "aux_loss", moe_aux_loss_coeff: float = 0.0,
                   moe_z_loss_coeff: float = 0.0, moe_router_num_groups: Optional[int] = None,
                   moe_router_group_topk: Optional[int] = None) -> MoESpec:
    """A MoESpec from Megatron-LM's flag names (the compact model file's keys)."""
    return MoESpec(num_experts=num_experts, router_topk=moe_router_topk, expert_ffn_hidden_size=moe_ffn_hidden_size,
                   shared_expert_ffn_hidden_size=moe_shared_expert_intermediate_size or 0,
                   router_load_balancing_type=moe_router_load_balancing_type,
                   aux_loss_coeff=moe_aux_loss_coeff, z_loss_coeff=moe_z_loss_coeff,
                   router_num_groups=moe_router_num_groups or 0, router_group_topk=moe_router_group_topk or 0)


MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
"""Megatron-LM's MLA flags (arguments.py, _add_mla_args), as compact-form keys and MLASpec fields."""


def mla_from_flags(multi_latent_attention: bool, **shape) -> Optional[MLASpec]:
    """An MLASpec from Megatron-LM's --multi-latent-attention and MLA flag values (their defaults where
    absent), or None without the switch; the shape flags alone are a ValueError, as they would change nothing."""
    if not multi_latent_attention:
        if shape:
            raise ValueError(f"{', '.join(sorted(shape))} need multi_latent_attention")
        return None
    return MLASpec(**shape)


_COMPACT_KEYS = {
    "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
    "ffn_hidden_size", "num_query_groups", "swiglu", "untie_embeddings_and_output_weights",
    "name", "schema_version", "max_position_embeddings",
    "normalization", "add_bias_linear", "position_embedding_type", "rotary_base",
    "kv_channels", "add_qkv_bias", "qk_layernorm", "apply_layernorm_1p",
    "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
    "moe_layer_freq", "moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_z_loss_coeff",
    "moe_router_num_groups", "moe_router_group_topk", "multi_latent_attention", *MLA_KEYS, "mtp_num_layers", "mtp_loss_scaling_factor",
    "hidden_dropout", "attention_dropout", "squared_relu", "window_size", "window_attn_skip_freq", "softmax_type",
}
_COMPACT_TYPES = {"swiglu": bool, "untie_embeddings_and_output_weights": bool, "add_bias_linear": bool,
                  "normalization": str, "position_embedding_type": str, "add_qkv_bias": bool,
                  "qk_layernorm": bool, "apply_layernorm_1p": bool, "name": str,
                  "moe_router_load_balancing_type": str, "moe_aux_loss_coeff": float, "moe_z_loss_coeff": float,
                  "moe_layer_freq": (int, list, str), "multi_latent_attention": bool,
                  "mtp_loss_scaling_factor": float, "hidden_dropout": float, "attention_dropout": float,
                  "squared_relu": bool, "window_size": (int, list), "window_attn_skip_freq": (int, list, str),
                  "softmax_type": str}


def model_from_dict(data: dict, name: str = "model", where: str = "") -> ModelSpec:
    """Accept both the rich form (with `layers`) and Megatron's compact form. `name` names a model
    whose file gives none; errors start with `where` (default: the name)."""
    label = where or name
    if not isinstance(data, dict):
        raise UserError(f"{label}: expected a JSON object")
    if isinstance(data.get("layers"), list):
        _check_layer_count(len(data["layers"]), label)  # before building a record per layer
        return serde.from_dict(ModelSpec, {"name": name, **data}, label)
    unknown = sorted(set(data) - _COMPACT_KEYS)
    if unknown:
        raise UserError(f"{label}: unknown key(s) {', '.join(unknown)}")
    missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size") if k not in data]
    if missing:
        raise UserError(f"{label}: missing required key(s) {', '.join(missing)}")
    _check_version(data.get("schema_version", MODEL_SCHEMA_VERSION), MODEL_SCHEMA_VERSION, label, UserError)
    for key, value in data.items():
        _check_compact_value(key, value, label)
    _check_layer_count(data["num_layers"], label)
    kwargs = {k: v for k, v in data.items() if k not in ("name", "schema_version", "max_position_embeddings")}
    try:
        kwargs["mla"] = mla_from_flags(kwargs.pop("multi_latent_attention", False),
                                       **{key: kwargs.pop(key) for key in MLA_KEYS if key in kwargs})
        return uniform_model(data.get("name", name), **kwargs)
    except ValueError as error:
        raise UserError(f"{label}: {error}") from None


def _check_compact_value(key: str, value: object, label: str) -> None:
    """A compact-form value: its type, and for the sizes a positive integer (0 never means 'default')."""
    expected = _COMPACT_TYPES.get(key, int)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
        names = expected.__name__ if isinstance(expected, type) else " or ".join(t.__name__ for t in expected)
        raise UserError(f"{label}.{key}: expected {names}, got {value!r}")
    if isinstance(value, (list, str)) and key == "moe_layer_freq":  # moe_layer_pattern checks it
        return
    if expected is float:
        serde.check_number(value, f"{label}.{key}")
        return
    own_checks = ("schema_version", "num_layers", "mtp_num_layers")
    if expected is int and key not in own_checks and value <= 0:
        raise UserError(f"{label}.{key}: must be a positive integer, got {value!r}")
    if expected is int:
        serde.check_number(value, f"{label}.{key}")


def _check_layer_count(count: int, label: str = "") -> None:
    """At least one layer and at most MAX_LAYERS (megatron_auto/limits.py)."""
    error = UserError if label else ValueError
    prefix = f"{label}: " if label else ""
    if count < 1:
        raise error(f"{prefix}a model needs at least one layer")
    if count > MAX_LAYERS:
        raise error(f"{prefix}{count} layers is more than the {MAX_LAYERS} megatron-auto plans for (megatron_auto/limits.py)")


def _check_mla_layer(layer: LayerSpec) -> None:
    """What Megatron-LM asserts of an MLA layer (arguments.py: MLA excludes --group-query-attention; its
    projections take no --add-qkv-bias)."""
    if layer.num_query_groups != layer.num_attention_heads:
        raise ValueError(f"multi-latent attention has no query groups: num_query_groups "
                         f"{layer.num_query_groups} must equal num_attention_heads {layer.num_attention_heads}")
    if layer.add_qkv_bias:
        raise ValueError("multi-latent attention's projections have no bias: drop add_qkv_bias")


def _check_mtp(depths: object, loss_scale: object) -> None:
    """Megatron-LM's bounds: a non-negative depth count (0 = no MTP) and a finite non-negative loss weight."""
    if not isinstance(depths, int) or isinstance(depths, bool) or depths < 0:
        raise ValueError(f"mtp_num_layers must be a non-negative integer, got {depths!r}")
    if not isinstance(loss_scale, (int, float)) or isinstance(loss_scale, bool) or not 0 <= loss_scale < float("inf"):
        raise ValueError(f"mtp_loss_scaling_factor must be a finite non-negative number, got {loss_scale!r}")


def _check_positive(record: object, *names: str) -> None:
    for name in names:
        value = getattr(record, name)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_version(version: object, current: int, what: str, error: type = ValueError) -> None:
    if version != current:
        raise error(f"{what} has schema_version {version!r}; this megatron-auto reads version {current}")
