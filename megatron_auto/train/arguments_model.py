"""The model's flags, grouped as Megatron-LM's arguments.py groups them: network size, MoE, MLA, MTP."""
from __future__ import annotations

import argparse


def add_network_size_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's _add_network_size_args: the shape of the Transformer and its embeddings."""
    group = parser.add_argument_group("network size")
    group.add_argument("--num-layers", type=int, help="the model's depth (required; or --encoder-num-layers)")
    group.add_argument("--encoder-num-layers", type=int, help="Megatron-LM's older spelling of --num-layers")
    group.add_argument("--hidden-size", type=int, required=True)
    group.add_argument("--num-attention-heads", type=int, required=True)
    group.add_argument("--num-query-groups", type=int)
    group.add_argument("--ffn-hidden-size", type=int)
    group.add_argument("--seq-length", type=int, help="the sequence length (required; or --encoder-seq-length)")
    group.add_argument("--encoder-seq-length", type=int, help="Megatron-LM's older spelling of --seq-length")
    group.add_argument("--max-position-embeddings", type=int)
    group.add_argument("--swiglu", action="store_true")
    group.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    group.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    group.add_argument("--padded-vocab-size", type=int, help="the embedding's rows (default: the vocabulary padded "
                                                             "to a multiple of --make-vocab-size-divisible-by x TP)")
    group.add_argument("--position-embedding-type", choices=("learned_absolute", "rope", "none"),
                       default="learned_absolute")
    group.add_argument("--use-rotary-position-embeddings", action="store_true",
                       help="older Megatron-LM spelling of --position-embedding-type rope")
    group.add_argument("--no-position-embedding", action="store_true",
                       help="no learned position table (older scripts pair it with rotary embeddings)")
    group.add_argument("--rotary-base", type=int, default=10000)
    group.add_argument("--rotary-percent", type=float, default=1.0)
    group.add_argument("--squared-relu", action="store_true", help="ReLU(x)^2 as the MLP's activation (Nemotron)")
    group.add_argument("--rotary-interleaved", action="store_true",
                       help="RoPE rotates channel pairs (2i, 2i+1) instead of halves (megatron-core's rope_utils)")
    group.add_argument("--apply-query-key-layer-scaling", action="store_true",
                       help="Q.K scaled down by the layer number and back up in an fp32 softmax (the unfused core)")
    group.add_argument("--use-rope-scaling", action="store_true", help="Llama 3.1's RoPE frequency scaling")
    group.add_argument("--rope-scaling-factor", type=float, default=8.0, help="its factor (default 8)")
    group.add_argument("--rotary-seq-len-interpolation-factor", type=int,
                       help="RoPE position interpolation: positions divided by this factor (a longer context)")
    group.add_argument("--normalization", choices=("LayerNorm", "RMSNorm"), default="LayerNorm")
    group.add_argument("--norm-epsilon", type=float, default=1e-5)
    group.add_argument("--disable-bias-linear", action="store_true")
    group.add_argument("--group-query-attention", action="store_true",
                       help="grouped-query attention with --num-query-groups groups (without it: multi-head)")
    group.add_argument("--kv-channels", type=int, help="width of one attention head (default hidden / heads)")
    group.add_argument("--add-qkv-bias", action="store_true", help="a bias on the QKV projection alone")
    group.add_argument("--qk-layernorm", action="store_true", help="normalise each query and key head")
    group.add_argument("--apply-layernorm-1p", action="store_true",
                       help="norm weights stored as gamma - 1, zero-initialised")


def add_mla_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM 0.16.1's multi-latent attention flags, with its defaults (arguments.py _add_mla_args), and
    --rope-type (its _add_network_size_args: MLA defaults to yarn, other attention runs rope)."""
    group = parser.add_argument_group("multi-latent attention (DeepSeek-V2/V3; Megatron-LM's names)")
    group.add_argument("--multi-latent-attention", action="store_true",
                       help="Megatron-Core's MLASelfAttention: keys and values from a compressed latent")
    group.add_argument("--q-lora-rank", type=int, help="query latent width (default: no query latent)")
    group.add_argument("--kv-lora-rank", type=int, default=32, help="key/value latent width")
    group.add_argument("--qk-head-dim", type=int, default=128, help="query/key channels per head without RoPE")
    group.add_argument("--qk-pos-emb-head-dim", type=int, default=64, help="query/key channels per head with RoPE")
    group.add_argument("--v-head-dim", type=int, default=128, help="value channels per head")
    group.add_argument("--rope-type", choices=("rope", "yarn"),
                       help="MLA's RoPE (default yarn); other attention takes rope only")
    group.add_argument("--rotary-scaling-factor", type=float, default=1.0, help="YaRN's scaling factor")
    group.add_argument("--mscale", type=float, default=1.0, help="YaRN's mscale")
    group.add_argument("--mscale-all-dim", type=float, default=0.0, help="YaRN's mscale_all_dim")


def add_mtp_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM 0.16.1's multi-token prediction flags, with its defaults (TransformerConfig's mtp_num_layers and
    mtp_loss_scaling_factor, which its arguments.py turns into flags); it has no other --mtp-* flag."""
    group = parser.add_argument_group("multi-token prediction (DeepSeek-V3; Megatron-LM's names)")
    group.add_argument("--mtp-num-layers", type=int, default=None,
                       help="MTP depths: modules after the decoder that each predict one more token (default: none)")
    group.add_argument("--mtp-loss-scaling-factor", type=float, default=0.1,
                       help="weight of the mean MTP loss beside the lm loss")


def moe_layer_freq(text: str):
    """Megatron-LM's --moe-layer-freq: an int N (every N-th layer is MoE), or a Python list expression of
    0/1 per layer such as "[1,0,1,0]" or "([0]*3+[1]*29)" (specs.model.parse_moe_layer_freq)."""
    from megatron_auto.specs.model import parse_moe_layer_freq

    try:
        return parse_moe_layer_freq(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--moe-layer-freq takes an int or a list such as [1,0,1,0], "
                                         f"got {text!r}") from None


def add_moe_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's _add_moe_args: the experts, their router and dispatcher, and expert parallelism."""
    group = parser.add_argument_group("mixture of experts (Megatron-LM's names)")
    group.add_argument("--num-experts", type=int, help="experts per MoE layer (without it: a dense model)")
    group.add_argument("--moe-router-topk", type=int, default=2)
    group.add_argument("--moe-ffn-hidden-size", type=int, help="width of one expert (default --ffn-hidden-size)")
    group.add_argument("--moe-shared-expert-intermediate-size", type=int)
    group.add_argument("--moe-layer-freq", type=moe_layer_freq, default=1)
    group.add_argument("--moe-router-load-balancing-type", default="aux_loss", nargs="+",
                       choices=("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"))
    group.add_argument("--moe-aux-loss-coeff", type=float, default=0.0, nargs="+")
    group.add_argument("--moe-z-loss-coeff", type=float)
    group.add_argument("--moe-token-dispatcher-type", default="allgather", choices=("alltoall", "allgather", "flex"),
                       help="flex (DeepEP/HybridEP kernels) runs the alltoall dispatcher")
    group.add_argument("--moe-grouped-gemm", action="store_true")
    group.add_argument("--moe-router-dtype", choices=("fp32", "fp64"))
    group.add_argument("--moe-router-pre-softmax", action="store_true")
    group.add_argument("--moe-router-score-function", choices=("softmax", "sigmoid"), default="softmax")
    group.add_argument("--moe-router-topk-scaling-factor", type=float)
    group.add_argument("--moe-expert-capacity-factor", type=float)
    group.add_argument("--moe-pad-expert-input-to-capacity", action="store_true")
    group.add_argument("--moe-token-drop-policy", choices=("probs", "position"), default="probs")
    group.add_argument("--moe-input-jitter-eps", type=float)
    group.add_argument("--moe-per-layer-logging", action="store_true")
    group.add_argument("--moe-router-enable-expert-bias", action="store_true",
                       help="auxiliary-loss-free balancing (DeepSeek-V3): a per-expert routing bias, updated after "
                            "each global batch; needs --moe-router-score-function sigmoid")
    group.add_argument("--moe-router-bias-update-rate", type=float, default=1e-3)
    group.add_argument("--moe-router-num-groups", type=int, help="expert groups for group-limited routing")
    group.add_argument("--moe-router-group-topk", type=int, help="groups a token's experts may come from")
    group.add_argument("--moe-shared-expert-overlap", action="store_true",
                       help="run the shared expert on its own CUDA stream beside the alltoall dispatch")
    group.add_argument("--moe-layer-recompute", action="store_true",
                       help="Megatron-LM's older spelling of --recompute-granularity selective with `moe` added "
                            "to --recompute-modules")
    group.add_argument("--expert-model-parallel-size", type=int, help="EP degree (a constraint under --auto-parallel)")
    group.add_argument("--expert-tensor-parallel-size", type=int,
                       help="expert TP degree (default --tensor-model-parallel-size)")


def position_embedding_type(args: argparse.Namespace) -> str:
    """Megatron-LM's resolution of --position-embedding-type and the older rotary/no-position flags."""
    if args.use_rotary_position_embeddings:
        return "rope"
    if args.no_position_embedding and args.position_embedding_type == "learned_absolute":
        return "none"
    return args.position_embedding_type
