"""Runtime of `hybrid`-space plans: per-layer TP/DP/ZeRO-1/ZeRO-3/recompute on Megatron-Core modules.

groups (pure rank arithmetic) -> process_groups (created once) -> relayout
(activations between layouts) -> segments/configs/model/build (blocks per
strategy run, a GPT shell for embedding and head) -> optim/finalize (per-part
DDP and optimizers, one global norm) -> session (what runtime.session calls).
"""
