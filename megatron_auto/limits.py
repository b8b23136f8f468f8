"""The largest jobs megatron-auto plans, so that `plan` stays bounded in time and memory.

The caps sit well above real models and clusters: GPT-3 175B has 96 layers, the
largest preset (gpt3-1t) 128, and the deepest published Transformers a few hundred
(DeepNet trained 1,000); the largest training clusters reported hold about 100k GPUs.
Below the caps the search's work grows about linearly in the layers
(benchmarks/bench_search.py, docs/benchmarks.md "Planning limits").
"""

MAX_LAYERS = 1024
"""Decoder layers of one model."""
MAX_GPUS = 131072
"""GPUs (ranks) of one job: num_nodes x gpus_per_node."""
MAX_GLOBAL_BATCH = 2**24
"""Samples per iteration (LLaMA-3 405B: 16M tokens = 2,048 samples of 8,192 tokens)."""
