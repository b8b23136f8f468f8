"""Which kernels a run uses: the core-attention backend and the optimizer step's implementation.

Planning prices the kernels the runtime will run, so both sides resolve the user's
choice (`auto` included) through these functions. Pure: no torch import.

Attention backends use Megatron-LM's names (`--attention-backend`, megatron.core's
AttnBackend). Without Transformer Engine the runtime has two kinds of core attention:
- `flash`: torch's scaled_dot_product_attention (flash / memory-efficient / cuDNN
  kernels on CUDA), which never materialises the s x s scores;
- `unfused`: Megatron-Core's DotProductAttention (scores, softmax and dropout as
  separate kernels, the s x s tensors kept for backward).
`fused` (cuDNN fused attention, a TE backend) runs as `flash` here, since SDPA picks
cuDNN's kernel itself where it is fastest; `local` is Megatron's name for `unfused`.

Optimizer implementations: `fused` is one multi-tensor kernel per step (torch's
`fused=True` Adam, apex/TE FusedAdam) with no per-parameter temporaries; `foreach`
is torch's default multi-tensor path, which allocates temporaries of the size of the
fp32 state it updates (measured: about 4 bytes per parameter,
../shared/reference/h100/README.md).

Bias fusions (Megatron's bias + GeLU/SwiGLU and bias + dropout + add, which
megatron-core 0.16.1 compiles with torch.compile): `on`, `off`, or `auto` = off.
Each compiled call costs about 0.15 ms of host time (guards and AOTAutograd
wrappers) against a few tens of microseconds of GPU time saved, and the runtime's
step is host-bound at small micro-batches: on one H100, GPT 1.7B shape, micro-batch 2,
the step took 0.859 s with them off against 0.902 s with them on (docs/benchmarks.md,
"Where the runtime's time goes"). The cost model prices the unfused kernels.

Weight-gradient accumulation fusion (Megatron's `gradient_accumulation_fusion`: each
linear layer's weight gradient is added into its fp32 `main_grad` by the GEMM itself,
instead of a 16-bit gradient plus a per-parameter hook that adds it): `on`, `off`, or
`auto`. `auto` follows Megatron-LM (on) where apex's extension imports, and on GPUs
without apex it runs this project's torch stand-in (patches/wgrad_accumulation_torch.py)
once that stand-in has passed its start-up check on the run's device (its CUDA branch
cannot run in the CPU tests). Measured on one H100 80GB, GPT 1.7B shape, micro-batch 2:
0.850 s per iteration with it on against 0.909 s off, 433 against 405 TFLOP/s, the same
peak memory (docs/benchmarks.md, "Runtime vs plain PyTorch on one GPU"). On CPU `auto`
is off (the CPU equivalence suite's references take Megatron DDP's hook path, and the
fused path is tested against them). `--no-gradient-accumulation-fusion` (Megatron-LM's
flag) is `off`.
"""
from __future__ import annotations

ATTENTION_BACKENDS = ("auto", "flash", "fused", "unfused", "local")
"""What `--attention-backend` accepts (Megatron-LM's spelling)."""
PRICED_ATTENTION = ("flash", "unfused")
"""The kinds of core attention the runtime runs and the cost model prices."""
OPTIMIZER_IMPLS = ("auto", "fused", "foreach")
"""What `--optimizer-impl` accepts."""
PRICED_OPTIMIZER = ("fused", "foreach")
"""The optimizer-step implementations the cost model prices."""
BIAS_FUSIONS = ("auto", "on", "off")
"""What `--bias-fusions` accepts."""
GRAD_ACCUMULATION_FUSIONS = ("auto", "on", "off")
"""What `--grad-accumulation-fusion` accepts."""

_ATTENTION_KIND = {"flash": "flash", "fused": "flash", "unfused": "unfused", "local": "unfused"}


def resolve_attention_backend(requested: str, on_gpu: bool) -> str:
    """`flash` or `unfused`: the core attention that runs for `requested`.

    `auto` is `flash` on GPUs. On CPU it is `unfused`: the CPU is the test bed, its measured
    profiles and validation were taken with Megatron's own attention, and `flash` stays
    selectable there (tests compare the two).
    """
    if requested not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend must be one of {', '.join(ATTENTION_BACKENDS)}, got {requested!r}")
    if requested == "auto":
        return "flash" if on_gpu else "unfused"
    return _ATTENTION_KIND[requested]


def resolve_optimizer_impl(requested: str, on_gpu: bool) -> str:
    """`fused` or `foreach`: the optimizer step that runs for `requested` (`auto`: fused on GPUs)."""
    if requested not in OPTIMIZER_IMPLS:
        raise ValueError(f"optimizer implementation must be one of {', '.join(OPTIMIZER_IMPLS)}, "
                         f"got {requested!r}")
    if requested == "auto":
        return "fused" if on_gpu else "foreach"
    return requested


def resolve_bias_fusions(requested: str, on_gpu: bool) -> bool:
    """Whether Megatron's bias fusions run for `requested`: `on` runs them on GPUs (they are
    compiled for CUDA; on CPU they stay off), `auto` and `off` keep them off (module docstring)."""
    if requested not in BIAS_FUSIONS:
        raise ValueError(f"bias fusions must be one of {', '.join(BIAS_FUSIONS)}, got {requested!r}")
    return requested == "on" and on_gpu


def resolve_grad_accumulation_fusion(requested: str, apex_extension: bool,
                                     torch_standin_checked: bool = False) -> bool:
    """Whether weight gradients are accumulated inside the GEMM for `requested`: `on` and `off` as said;
    `auto` with apex's extension (`apex_extension`) or with the torch stand-in where it passed its check on
    this run's GPU (`torch_standin_checked`), as the module docstring says why."""
    if requested not in GRAD_ACCUMULATION_FUSIONS:
        raise ValueError(f"grad accumulation fusion must be one of {', '.join(GRAD_ACCUMULATION_FUSIONS)}, "
                         f"got {requested!r}")
    return requested == "on" or (requested == "auto" and (apex_extension or torch_standin_checked))
