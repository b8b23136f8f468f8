"""What hidden communication costs the compute beside it.

Traffic that the schedule hides behind compute is not free: NCCL runs each collective as a kernel of its own, one
thread block per channel, and every block holds a streaming multiprocessor for as long as the collective runs.
The GEMMs and attention kernels launched beside it get the rest: while a collective of T seconds runs, the compute
beside it advances at (S - c) / S of its pace, so the stage takes T x c / S longer than the compute alone. This
module prices that for the traffic the cost model hides behind compute:
- the gradient reduce-scatter (or all-reduce) and the parameter all-gather of data parallelism that run beside
  the backward and the forward (Megatron-Core's DDP, overlap_grad_reduce and overlap_param_gather);
- the weight gathers and gradient reduce-scatters of ZeRO-3 (Megatron-FSDP) that run beside a layer's compute;
- the token dispatch that the shared expert or the EP overlap hides (cost/shared_expert.py, cost/ep_overlap.py).
  The flex dispatcher's kernels are DeepEP's or HybridEP's, not NCCL's: they hold the SMs they are configured
  with (TrainingSpec.moe_deepep_num_sms and moe_hybridep_num_sms, 20 and 16 by default in megatron-core 0.16.1).
Left out:
- TE's userbuffer overlap (--tp-comm-overlap), which reserves its SMs itself (cost/tp_overlap.py);
- point-to-point transfers to one peer, the K/V ring of context parallelism (TE's AttnFuncWithCPAndKVP2P) and the
  pipeline's sends: NCCL runs them on its channels per peer, the fewest any peer gets rounded up to a power of two,
  and a network peer gets 2 (NCHANNELS_PER_NET_PEER; NCCL src/graph/paths.cc, ncclTopoComputeP2pChannels), so a
  job across nodes sends and receives on about 4 blocks, not a collective's 24; not measured here;
- the sequence-parallel all-gathers that the backward issues beside its input-gradient GEMM: small.

c, the SMs one collective holds (GpuSpec.collective_sms; specs/presets.py H100_COLLECTIVE_SMS), is measured: on an
H100 an ncclAllGather beside a cuBLAS GEMM launched 24 blocks (NVIDIA developer forum, "Compute-Communication
Overlap Causes Severe GEMM Performance Degradation because of Tail Effect", 2025, Nsight Systems trace; NCCL's own
cap is 32 CTAs, the max_ctas default that megatron/core/parallel_state.py quotes). With the H100's 132 SMs that is
an 18% slower compute while the traffic runs, which matches the mean slowdown measured for compute overlapped with
communication on H100, A100 and MI250 (18.9%, at most 40%: "Characterizing Compute-Communication Overlap in
GPU-Accelerated Distributed Deep Learning", arXiv 2507.03114). HBM contention and the extra waves a GEMM may need on
fewer SMs come on top and are not priced. Where the GPU's SM count or c is not known (0), nothing is charged.
"""
from __future__ import annotations

from ..specs.cluster import ClusterSpec
from ..specs.training import TrainingSpec


def interference_share(cluster: ClusterSpec) -> float:
    """c / S: the share of its SMs a GPU of `cluster` loses to one collective running beside compute; 0 where
    either is not known, and where a cluster profile measured the share of traffic hidden behind compute
    (profiling/overlap.py times an all-reduce beside a matmul loop: what the compute lost is in that share)."""
    if cluster.measured is not None and cluster.measured.cluster is not None:
        return 0.0
    sms, taken = cluster.gpu.sm_count, cluster.gpu.collective_sms
    if sms <= 0 or taken <= 0:
        return 0.0
    return min(taken, sms) / sms


def interference_seconds(hidden_comm_s: float, cluster: ClusterSpec) -> float:
    """Seconds the compute beside `hidden_comm_s` seconds of hidden collective traffic loses to it."""
    return max(0.0, hidden_comm_s) * interference_share(cluster)


def exposed_beside(comm_s: float, compute_s: float, cluster: ClusterSpec) -> float:
    """Seconds `comm_s` of collective traffic run beside `compute_s` of compute add: what the overlap cannot hide
    (all of it where the cluster overlaps nothing, grad_overlap 0), plus what the hidden part takes from the
    compute."""
    hidden = cluster.grad_overlap * min(comm_s, compute_s)
    return comm_s - hidden + interference_seconds(hidden, cluster)


def dispatch_interference_share(cluster: ClusterSpec, training: TrainingSpec) -> float:
    """The share for the token dispatch: NCCL's collective share for the alltoall dispatcher; for the flex
    dispatcher, the SMs its backend is configured with over the GPU's (nothing where interference_share is 0)."""
    share = interference_share(cluster)
    if share == 0.0 or training.moe_token_dispatcher != "flex":
        return share
    return min(training.flex_backend_sms, cluster.gpu.sm_count) / cluster.gpu.sm_count
