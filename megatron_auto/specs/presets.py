"""Shipped presets: the models of the Megatron papers, LLaMA and two MoE models, and three clusters.

GPT-3 shapes: Narayanan et al. SC21, Table 1 (s=2048, V=51200, 4h MLP, GeLU, tied
embeddings). LLaMA shapes: Touvron et al. 2023 (LLaMA 2) and Meta's LLaMA 3
model card (SwiGLU, GQA, untied head); LLaMA 3.1 405B: Dubey et al. 2024 (arXiv 2407.21783)
Table 3 (126 layers, h 16384, 128 heads, 8 KV heads, FFN 53248, vocabulary 128,000 (128,256 in its
config.json), rotary base 500,000), pre-trained at sequence length 8192. MoE shapes: see _moe_presets. Hardware figures:
shared/reference/hardware.md.
"""
from __future__ import annotations

from dataclasses import replace

from .cluster import ClusterSpec, ComputeEfficiency, GpuSpec, LinkSpec, NodeGroup
from .model import MLASpec, ModelSpec, uniform_model

GIB = 1024**3

# name: (layers, hidden, heads) from SC21 Table 1.
_GPT3_SHAPES = {
    "gpt3-1.7b": (24, 2304, 24),
    "gpt3-3.6b": (30, 3072, 32),
    "gpt3-7.5b": (36, 4096, 32),
    "gpt3-18.4b": (40, 6144, 48),
    "gpt3-39.1b": (48, 8192, 64),
    "gpt3-76.1b": (60, 10240, 80),
    "gpt3-145.6b": (80, 12288, 96),
    "gpt3-175b": (96, 12288, 96),
    "gpt3-310b": (96, 16384, 128),
    "gpt3-530b": (105, 20480, 128),
    "gpt3-1t": (128, 25600, 160),
}

# name: (layers, hidden, heads, kv groups, ffn, seq, vocab, rotary base)
_LLAMA_SHAPES = {
    "llama2-7b": (32, 4096, 32, 32, 11008, 4096, 32000, 10000),
    "llama2-13b": (40, 5120, 40, 40, 13824, 4096, 32000, 10000),
    "llama2-70b": (80, 8192, 64, 8, 28672, 4096, 32000, 10000),
    "llama3-8b": (32, 4096, 32, 8, 14336, 8192, 128256, 500000),
    "llama3-70b": (80, 8192, 64, 8, 28672, 8192, 128256, 500000),
    "llama3.1-405b": (126, 16384, 128, 8, 53248, 8192, 128256, 500000),
}
# LLaMA's architecture: SwiGLU, RMSNorm, no linear biases, rotary positions, untied head.
_LLAMA_ARCHITECTURE = dict(swiglu=True, normalization="RMSNorm", add_bias_linear=False,
                           position_embedding_type="rope", untie_embeddings_and_output_weights=True)
# The LLaMA-style models below were trained without dropout: NeMo's LlamaConfig, MixtralConfig and DeepSeek
# configs and Megatron-LM's examples/llama scripts set both probabilities to 0 (the GPT-3 shapes keep
# Megatron-LM's 0.1, as SC21 trained them). The tiny test presets keep the defaults their runs use.
_NO_DROPOUT = dict(hidden_dropout=0.0, attention_dropout=0.0)


def _model_presets() -> dict[str, ModelSpec]:
    presets = {
        name: uniform_model(name, layers, hidden, heads, seq_length=2048, vocab_size=51200)
        for name, (layers, hidden, heads) in _GPT3_SHAPES.items()
    }
    for name, (layers, hidden, heads, groups, ffn, seq, vocab, base) in _LLAMA_SHAPES.items():
        presets[name] = uniform_model(name, layers, hidden, heads, seq, vocab, ffn_hidden_size=ffn,
                                      num_query_groups=groups, rotary_base=base, **_LLAMA_ARCHITECTURE,
                                      **_NO_DROPOUT)
    presets.update(_moe_presets())
    # Tiny models for tests and CPU runs.
    presets["tiny-gpt"] = uniform_model("tiny-gpt", 4, 64, 4, seq_length=32, vocab_size=128)
    presets["tiny-gpt-8l"] = uniform_model("tiny-gpt-8l", 8, 128, 8, seq_length=64, vocab_size=512)
    presets["tiny-llama"] = uniform_model("tiny-llama", 4, 64, 4, seq_length=32, vocab_size=128,
                                          ffn_hidden_size=176, num_query_groups=2, **_LLAMA_ARCHITECTURE)
    tiny_moe = dict(seq_length=32, vocab_size=128, ffn_hidden_size=128, num_query_groups=2, **_LLAMA_ARCHITECTURE)
    presets["tiny-mixtral"] = uniform_model("tiny-mixtral", 4, 64, 4, num_experts=4, moe_router_topk=2, **tiny_moe)
    presets["tiny-mla"] = uniform_model("tiny-mla", 4, 64, 4, seq_length=32, vocab_size=128, ffn_hidden_size=176,
                                        qk_layernorm=True, mla=MLASpec(kv_lora_rank=32, qk_head_dim=16,
                                                                       qk_pos_emb_head_dim=8, v_head_dim=16,
                                                                       q_lora_rank=24), **_LLAMA_ARCHITECTURE)
    presets["tiny-deepseek-moe"] = uniform_model(
        "tiny-deepseek-moe", 4, 64, 4, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=32,
        moe_shared_expert_intermediate_size=64, moe_layer_freq=[0, 1, 1, 1], **tiny_moe)
    return presets


def _moe_presets() -> dict[str, ModelSpec]:
    """Mixtral 8x7B: Jiang et al. 2024 (arXiv 2401.04088) Table 1 and its Hugging Face config.json (32 layers,
    h 4096, 32 heads, 8 KV heads, ffn 14336, 8 experts top-2, vocab 32000, rope theta 1e6, untied; 46,702,792,704
    parameters as transformers counts them); seq 4096 as Megatron-LM's examples/mixtral train. DeepSeekMoE 16B:
    Dai et al. 2024 (arXiv 2401.06066, 16.4B total) and the config.json of deepseek-ai/deepseek-moe-16b-base
    (28 layers, h 2048, 16 heads, first_k_dense_replace 1 with intermediate_size 10944, 64 routed experts of
    moe_intermediate_size 1408 top-6, n_shared_experts 2 = one shared MLP of 2816, vocab 102400, seq 4096,
    rope theta 10000, untied): 16,375,728,128 parameters by tests/test_moe_specs.py's arithmetic.

    Multi-latent attention (MLASpec), from the config.json files of deepseek-ai/DeepSeek-V2-Lite (27 layers,
    h 2048, 16 heads, no query latent, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128, first layer dense of
    10944, 64 experts of 1408 top-6, 2 shared (one MLP of 2816), vocab 102400; 15.7B in Liu et al. 2024,
    arXiv 2405.04434) and deepseek-ai/DeepSeek-V3 (61 layers, h 7168, 128 heads, q_lora_rank 1536,
    kv_lora_rank 512, first 3 layers dense of 18432, 256 experts of 2048 top-8, 1 shared of 2048, vocab 129280,
    num_nextn_predict_layers 1: one multi-token-prediction module; 671B plus that module's 14B, DeepSeek-AI
    2024, arXiv 2412.19437). Their latent norms are --qk-layernorm; seq 4096 as both were pre-trained."""
    mixtral = uniform_model("mixtral-8x7b", 32, 4096, 32, 4096, 32000, ffn_hidden_size=14336, num_query_groups=8,
                            rotary_base=1000000, num_experts=8, moe_router_topk=2, **_LLAMA_ARCHITECTURE, **_NO_DROPOUT)
    deepseek = uniform_model("deepseek-moe-16b", 28, 2048, 16, 4096, 102400, ffn_hidden_size=10944,
                             num_experts=64, moe_router_topk=6, moe_ffn_hidden_size=1408,
                             moe_shared_expert_intermediate_size=2 * 1408, moe_layer_freq=[0] + [1] * 27,
                             **_LLAMA_ARCHITECTURE, **_NO_DROPOUT)
    v2_lite = uniform_model("deepseek-v2-lite", 27, 2048, 16, 4096, 102400, ffn_hidden_size=10944,
                            qk_layernorm=True, mla=MLASpec(kv_lora_rank=512), num_experts=64, moe_router_topk=6,
                            moe_ffn_hidden_size=1408, moe_shared_expert_intermediate_size=2 * 1408,
                            moe_layer_freq=[0] + [1] * 26, **_LLAMA_ARCHITECTURE, **_NO_DROPOUT)
    v3 = uniform_model("deepseek-v3", 61, 7168, 128, 4096, 129280, ffn_hidden_size=18432, qk_layernorm=True,
                       mla=MLASpec(kv_lora_rank=512, q_lora_rank=1536), num_experts=256, moe_router_topk=8,
                       moe_ffn_hidden_size=2048, moe_shared_expert_intermediate_size=2048,
                       moe_router_num_groups=8, moe_router_group_topk=4,  # node-limited: n_group 8, topk_group 4
                       moe_layer_freq=[0] * 3 + [1] * 58, mtp_num_layers=1, **_LLAMA_ARCHITECTURE, **_NO_DROPOUT)
    return {model.name: model for model in (mixtral, deepseek, v2_lite, v3)}


MODEL_PRESETS: dict[str, ModelSpec] = _model_presets()

# One GEMM-efficiency model per GPU type; the A100 constants are fitted once to
# all five rows of SC21 Table 1 by validation/calibrate_compute.py (docs/cost_model.md).
A100_COMPUTE = ComputeEfficiency(max_fraction=0.70, half_dim=96.0)
# H100: the same law fitted to 160 measured bf16 GEMMs (data/reference/h100/gemm_bf16.jsonl) by
# `.venv/bin/python -m validation.calibrate_compute --gemms` (least squares for max_fraction on a
# (half_dim, latency_s) grid; mean |error| 5.2%); layers priced kernel by kernel (cost/layer_kernels.py,
# docs/cost_model.md "H100 calibration"). Flash attention (SDPA, FlashAttention-2 kernels) reaches
# about 35% of the H100's peak (Dao 2023, FlashAttention-2, H100 benchmarks: ~335 TFLOP/s).
H100_COMPUTE = ComputeEfficiency(max_fraction=0.7435, half_dim=100.0, latency_s=20e-6, kernel_level=True,
                                 flash_fraction=0.35)
# Host seconds per eager op of a Megatron-Core layer: the 7.5B layer at t=8 takes 1.68-1.73 ms forward and
# 1.99-2.08 ms backward at micro-batch 1 and 2 alike (host-bound), over 66 and 86 ops (cost/layer_kernels.py).
H100_KERNEL_LAUNCH_S = 25e-6
# Thread blocks (one SM each) of one NCCL collective beside compute on an H100: 24, measured in an Nsight Systems
# trace of an ncclAllGather beside a cuBLAS GEMM (cost/comm_interference.py gives the sources).
H100_COLLECTIVE_SMS = 24

# Device <-> pinned host copies over each GPU's own x16 link, one direction: the H100 SXM5 datasheet gives PCIe Gen5
# 128 GB/s (both directions), the A100 SXM4 datasheet PCIe Gen4 64 GB/s. A copy reaches at most ~90% of the lanes'
# rate (128b/130b coding and ~24 bytes of TLP header per 256-byte payload); 0.8 is taken for what pinned
# cudaMemcpyAsync reaches beside training traffic (not measured here; docs/cost_model.md "Activation offloading").
HOST_LINK_EFFICIENCY = 0.8
H100_HOST_LINK_BYTES_PER_S = 64e9 * HOST_LINK_EFFICIENCY
A100_HOST_LINK_BYTES_PER_S = 32e9 * HOST_LINK_EFFICIENCY

# Memory outside the model's tensors on an H100 80GB (data/reference/h100/README.md, torch.cuda.mem_get_info):
# 79.18 GiB usable; CUDA context 0.61 GiB plus 0.06 GiB of cuBLAS workspace; 0.55 GiB per NCCL communicator.
H100_USABLE_BYTES = round(79.18 * GIB)
CUDA_CONTEXT_BYTES = round((0.61 + 0.06) * GIB)
NCCL_COMMUNICATOR_BYTES = round(0.55 * GIB)
# The caching allocator's reserve above the allocated peak: the mean of max_memory_reserved /
# max_memory_allocated - 1 over the five completed runs of data/reference/h100/runs_gpt_1.7b.json.
ALLOCATOR_RESERVE_FRACTION = 0.059
# The safety margin: the largest shortfall of the predicted allocated peak below the measured one over
# those runs (0.5%), rounded up to the next whole percent (docs/cost_model.md, "Memory margin"); the
# allocator's reserve is not counted against the capacity (cost/peak_memory.py, device_bytes).
GPU_MEMORY_MARGIN = 0.01
_CUDA_MEMORY = dict(framework_overhead_bytes=0, cuda_context_bytes=CUDA_CONTEXT_BYTES,
                    nccl_communicator_bytes=NCCL_COMMUNICATOR_BYTES,
                    allocator_reserve_fraction=ALLOCATOR_RESERVE_FRACTION, memory_margin=GPU_MEMORY_MARGIN)

CLUSTER_PRESETS: dict[str, ClusterSpec] = {
    "dgx-a100-80gb": ClusterSpec(
        name="dgx-a100-80gb", num_nodes=1, gpus_per_node=8,
        gpu=GpuSpec("A100-SXM4-80GB", 80 * GIB, 312e12, 2.0e12, sm_count=108,  # SMs: A100 datasheet
                    host_link_bytes_per_s=A100_HOST_LINK_BYTES_PER_S),
        intra_node=LinkSpec(300e9, 5e-6, efficiency=0.78),   # NVLink 3, 300 GB/s each way
        inter_node=LinkSpec(25e9, 10e-6, efficiency=0.85),   # 1x HDR 200 Gb/s per GPU
        compute=A100_COMPUTE, **_CUDA_MEMORY,
    ),
    "dgx-h100-80gb": ClusterSpec(
        name="dgx-h100-80gb", num_nodes=1, gpus_per_node=8,
        gpu=GpuSpec("H100-SXM5-80GB", 80 * GIB, 989e12, 3.35e12, kernel_launch_s=H100_KERNEL_LAUNCH_S,
                    usable_memory_bytes=H100_USABLE_BYTES, fp8_peak_flops=1979e12,  # FP8: datasheet, dense
                    sm_count=132, host_link_bytes_per_s=H100_HOST_LINK_BYTES_PER_S,  # H100 SXM5 datasheet
                    collective_sms=H100_COLLECTIVE_SMS),  # measured (cost/comm_interference.py)
        intra_node=LinkSpec(450e9, 5e-6, efficiency=0.78),   # NVLink 4, 450 GB/s each way
        inter_node=LinkSpec(50e9, 10e-6, efficiency=0.85),   # 1x NDR 400 Gb/s per GPU
        compute=H100_COMPUTE, **_CUDA_MEMORY,
    ),
    # Up to 8 gloo processes on this 2-core, 24 GiB machine; `megatron-auto
    # profile-cluster` replaces these analytic guesses with measurements.
    "cpu-gloo": ClusterSpec(
        name="cpu-gloo", num_nodes=1, gpus_per_node=8,
        gpu=GpuSpec("cpu-process", 2 * GIB, 20e9, 5e9),
        intra_node=LinkSpec(1e9, 50e-6, efficiency=1.0),
        inter_node=LinkSpec(1e9, 50e-6, efficiency=1.0),
        compute=ComputeEfficiency(max_fraction=0.5, half_dim=16.0),
        framework_overhead_bytes=256 * 1024**2,
        grad_overlap=0.0,  # the runtime reduces gradients after the backward on CPU (runtime/config.py)
        dropout_mask_bytes=4,  # fp32 noise tensors (ATen _dropout_impl on CPU; profile-model's saved bytes)
    ),
}


def mixed_cluster(name: str, parts: tuple[tuple[ClusterSpec, int], ...]) -> ClusterSpec:
    """A cluster of node groups (issue 39), each some nodes of a uniform cluster, in node-rank order; the groups
    may differ in GPUs per node. Its own GPU, NVLink, node size and GEMM fields are an envelope that no group
    exceeds (the fastest GPU with the most memory and the fewest host seconds per op, the fastest links, the
    largest node), so that the search's screens stay bounds (traffic between stages is priced at the slower
    group's NICs: cost.estimate.stage_costs; TP groups stay inside ClusterSpec.common_node_gpus); FP8 only where
    every group has it."""
    groups = tuple(NodeGroup(base.name, nodes, base.gpu, base.intra_node, base.inter_node, base.compute,
                             gpus_per_node=base.gpus_per_node) for base, nodes in parts)
    gpus = [group.gpu for group in groups]
    fastest = max(groups, key=lambda group: group.gpu.peak_flops)
    envelope = replace(fastest.gpu, name=" + ".join(dict.fromkeys(gpu.name for gpu in gpus)),
                       memory_bytes=max(gpu.memory_bytes for gpu in gpus),
                       usable_memory_bytes=max(gpu.capacity_bytes for gpu in gpus),
                       memory_bandwidth_bytes_per_s=max(gpu.memory_bandwidth_bytes_per_s for gpu in gpus),
                       kernel_launch_s=min(gpu.kernel_launch_s for gpu in gpus),
                       fp8_peak_flops=min(gpu.fp8_peak_flops for gpu in gpus),
                       sm_count=max(gpu.sm_count for gpu in gpus),
                       collective_sms=min(gpu.collective_sms for gpu in gpus),
                       host_link_bytes_per_s=max(gpu.host_link_bytes_per_s for gpu in gpus))
    fastest_network = max((group.inter_node for group in groups), key=lambda link: link.effective_bandwidth)
    first = parts[0][0]
    return replace(first, name=name, num_nodes=sum(nodes for _, nodes in parts), gpu=envelope,
                   gpus_per_node=max(base.gpus_per_node for base, _ in parts),
                   intra_node=fastest.intra_node, inter_node=fastest_network, compute=fastest.compute,
                   node_groups=groups)



def with_node_speeds(cluster: ClusterSpec, speeds: tuple[float, ...]) -> ClusterSpec:
    """`cluster` with each node's measured speed (node-rank order, each in (0, 1]: a node at 0.5 runs its GEMMs
    and memory passes at half the model's rate): consecutive nodes of one group at one speed become a node group
    of their own at that speed_factor (issue 39: a slow node, a throttled GPU). The envelope fields stay: no node
    runs faster than before."""
    if len(speeds) != cluster.num_nodes:
        raise ValueError(f"{len(speeds)} node speeds for the {cluster.num_nodes} nodes of cluster '{cluster.name}'")
    if any(not 0 < speed <= 1 for speed in speeds):
        raise ValueError(f"node speeds are shares of the modelled speed, in (0, 1]: got {list(speeds)}")
    base = cluster.node_groups or (NodeGroup(cluster.name, cluster.num_nodes, cluster.gpu, cluster.intra_node,
                                             cluster.inter_node, cluster.compute),)
    owners = [group for group in base for _ in range(group.num_nodes)]
    groups: list[NodeGroup] = []
    for node, (group, speed) in enumerate(zip(owners, speeds)):
        factor = group.speed_factor * speed
        if groups and node > 0 and owners[node - 1] is group and speeds[node - 1] == speed:
            groups[-1] = replace(groups[-1], num_nodes=groups[-1].num_nodes + 1)
        else:
            name = group.name if speed == 1 else f"{group.name} at {speed:g}"
            groups.append(replace(group, name=name, num_nodes=1, speed_factor=factor))
    return replace(cluster, node_groups=tuple(groups)) if len(groups) > 1 or groups[0].speed_factor < 1 else cluster

def with_measured_speeds(cluster: ClusterSpec) -> ClusterSpec:
    """`cluster` at the node speeds its attached cluster profile measured (`profile-cluster`: ClusterProfile.
    node_speeds) where the profile measured as many nodes as the cluster has and one ran slow; else unchanged (a
    profile of a few nodes still lends its collective curves to a larger job)."""
    profile = cluster.measured.cluster if cluster.measured is not None else None
    if profile is None or len(profile.node_speeds) != cluster.num_nodes or min(profile.node_speeds) >= 1.0:
        return cluster
    return with_node_speeds(cluster, profile.node_speeds)


# 2 DGX-H100 nodes (node ranks 0-1) beside 2 DGX-A100 80GB nodes (2-3): the example of issue 39.
CLUSTER_PRESETS["mixed-h100-a100"] = mixed_cluster(
    "mixed-h100-a100", ((CLUSTER_PRESETS["dgx-h100-80gb"], 2), (CLUSTER_PRESETS["dgx-a100-80gb"], 2)))
