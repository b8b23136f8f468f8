"""Run a `megatron`-space Plan on Megatron-Core (the only package that imports torch/megatron.core).

Modules: settings (run options), layout (Plan -> Megatron layout, via
megatron_flags), manual_plan (Megatron flags -> Plan), distributed (process
groups; teardown: what outlives them), config (Megatron config records), model (GPT chunks + DDP), data
(samples per DP rank), step (schedules), checkpoint (dist_checkpointing),
metrics (FLOPs, log lines), session (build, train and close).

On a CPU-only host call `patches.apply_all()` before building a session.
"""
