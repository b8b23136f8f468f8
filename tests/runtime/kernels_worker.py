"""One rank of the kernel checks: SDPA core attention against Megatron's unfused one, the fusions,
and torch Adam's fused step against its foreach step, all under Megatron's TP groups.

Usage (per rank, RANK/WORLD_SIZE/MASTER_* set): python kernels_worker.py CASES.json RESULTS.json
Tensor parallelism is the world size. Each case: {"name", "kind": core|layer|dropout|optimizer, ...};
the last rank writes {name: {measured numbers}} to RESULTS.json (its own rank's numbers, except where a
case gathers over the TP group), with "threads_closed" the threads it holds once the case's groups are destroyed,
and "group_threads_closed" those of them that process groups run.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import sys

import patches

patches.apply_all()

import torch  # noqa: E402

from megatron_auto.runtime import distributed  # noqa: E402
from megatron_auto.runtime.settings import DataSettings, TrainSettings  # noqa: E402
from megatron_auto.specs.model import uniform_model  # noqa: E402
from tests.runtime.worker_stats import group_thread_count, thread_count  # noqa: E402

HIDDEN, HEADS, SEQ, BATCH = 64, 4, 32, 2


def initialize_tp() -> None:
    from megatron.core import parallel_state, tensor_parallel

    distributed.destroy_parallel_groups()  # the last case's groups, their threads too
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=torch.distributed.get_world_size())
    tensor_parallel.model_parallel_cuda_manual_seed(1234)


def make_config(case: dict, **overrides):
    from megatron.core.transformer import TransformerConfig

    swiglu = case.get("swiglu", False)
    fields = dict(num_layers=4, hidden_size=HIDDEN, num_attention_heads=HEADS,
                  num_query_groups=case.get("groups", HEADS), ffn_hidden_size=128, gated_linear_unit=swiglu,
                  activation_func=torch.nn.functional.silu if swiglu else torch.nn.functional.gelu,
                  add_bias_linear=not swiglu, normalization="RMSNorm" if swiglu else "LayerNorm",
                  hidden_dropout=0.0, attention_dropout=case.get("dropout", 0.0),
                  tensor_model_parallel_size=torch.distributed.get_world_size(), use_cpu_initialization=True,
                  apply_query_key_layer_scaling=case.get("layer_scaling", False),
                  softmax_scale=case.get("softmax_scale"), bias_activation_fusion=False, bias_dropout_fusion=False,
                  masked_softmax_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False)
    fields.update(overrides)
    return TransformerConfig(**fields)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _cores(case: dict):
    """[Megatron's DotProductAttention, the core under test] (SDPAttention, or with "core": "mla_unfused"
    MLADotProductAttention). With "k_width"/"v_width" (multi-latent attention's head widths) the cores under
    test get them as MLASelfAttention passes them (k_channels, v_channels), and Megatron's core, whose forward
    takes any widths but views its context as kv_channels per head, gets kv_channels = v_width."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from megatron_auto.runtime.attention import MLADotProductAttention, SDPAttention

    config = make_config(case)
    kinds = dict(layer_number=case.get("layer_number", 1), attn_mask_type=AttnMaskType.causal, attention_type="self",
                 softmax_scale=config.softmax_scale)
    if "v_width" not in case:
        return [DotProductAttention(config=config, **kinds), SDPAttention(config=config, **kinds)]
    reference = DotProductAttention(config=make_config(case, kv_channels=case["v_width"]), **kinds)
    tested = MLADotProductAttention if case.get("core") == "mla_unfused" else SDPAttention
    return [reference, tested(config=config, k_channels=case["k_width"], v_channels=case["v_width"], **kinds)]


def run_core(case: dict) -> dict:
    """Both cores on the same q, k, v of this rank's heads: output and input-gradient errors."""
    unfused, sdpa = _cores(case)
    heads, groups = unfused.num_attention_heads_per_partition, unfused.num_query_groups_per_partition
    torch.manual_seed(11 + torch.distributed.get_rank())
    k_width, v_width = case.get("k_width", HIDDEN // HEADS), case.get("v_width", HIDDEN // HEADS)
    shapes = ((heads, k_width), (groups, k_width), (groups, v_width))
    inputs = [torch.randn(SEQ, BATCH, n, width) for n, width in shapes]
    mask = None
    if case.get("mask"):  # an arbitrary boolean mask, True = masked out; the diagonal always kept
        mask = (torch.rand(BATCH, 1, SEQ, SEQ) < 0.3) & ~torch.eye(SEQ, dtype=torch.bool)
    grad_out = torch.randn(SEQ, BATCH, heads * v_width)
    results = []
    for core in (unfused, sdpa):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = core(*leaves, mask)
        out.backward(grad_out)
        results.append((out.detach(), [leaf.grad for leaf in leaves]))
    (ref, ref_grads), (got, got_grads) = results
    return {"output": relative_error(got, ref), "shape_ok": list(got.shape) == list(ref.shape),
            "grads": [relative_error(g, r) for g, r in zip(got_grads, ref_grads)],
            "core": type(sdpa).__name__, "width": got.shape[-1]}


def run_cp_core(case: dict) -> dict:
    """SDPA core with the world as its context-parallel group, each rank holding its two chunks of the
    sequence, against Megatron's unfused attention over the whole sequence: the errors of this rank's
    chunks of the output and of the q, k, v gradients, the largest over the ranks."""
    from megatron.core import parallel_state
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from megatron_auto.runtime.attention import SDPAttention
    from megatron_auto.runtime.context_parallel import chunks_of_rank

    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    distributed.destroy_parallel_groups()  # the last case's groups, their threads too
    parallel_state.initialize_model_parallel(context_parallel_size=world)
    kinds = dict(layer_number=case.get("layer_number", 1), attn_mask_type=AttnMaskType.causal, attention_type="self")
    whole = DotProductAttention(config=make_config(case, tensor_model_parallel_size=1), **kinds)
    split = SDPAttention(config=make_config(case, tensor_model_parallel_size=1, context_parallel_size=world),
                         **kinds, softmax_scale=case.get("softmax_scale"))
    torch.manual_seed(11)  # the same whole sequence on every rank
    groups, width = case.get("groups", HEADS), HIDDEN // HEADS
    inputs = [torch.randn(SEQ, BATCH, n, width) for n in (HEADS, groups, groups)]
    grad_out = torch.randn(SEQ, BATCH, HEADS * width)
    mine = functools.partial(chunks_of_rank, cp_rank=rank, cp_size=world)
    results = []
    for core, tensors, grad in ((whole, inputs, grad_out), (split, [mine(t) for t in inputs], mine(grad_out))):
        leaves = [t.clone().requires_grad_() for t in tensors]
        out = core(*leaves, None)
        out.backward(grad)
        results.append((out.detach(), [leaf.grad for leaf in leaves]))
    (ref, ref_grads), (got, got_grads) = results
    errors = torch.tensor([relative_error(got, mine(ref))] + [relative_error(g, mine(r))
                                                              for g, r in zip(got_grads, ref_grads)])
    torch.distributed.all_reduce(errors, op=torch.distributed.ReduceOp.MAX)
    return {"output": float(errors[0]), "grads": errors[1:].tolist(), "shape_ok": got.shape[0] == SEQ // world,
            "cp_size": parallel_state.get_context_parallel_world_size()}


VOCAB = 96


def _gpt_on_sdpa(case: dict, world: int):
    """A 2-layer GPT on the local spec with SDPA core attention, context-parallel over the world; its weights
    are drawn on the CPU from one seed, so they are the same whatever the world."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel

    from megatron_auto.runtime.kernels import RunKernels, layer_spec

    distributed.destroy_parallel_groups()  # the last case's groups, their threads too
    parallel_state.initialize_model_parallel(context_parallel_size=world)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    torch.manual_seed(1234)
    config = make_config(case, num_layers=2, tensor_model_parallel_size=1, context_parallel_size=world)
    kernels = RunKernels(layer_spec="local", attention="flash", attention_request="flash",
                         bias_activation_fusion=False, bias_dropout_fusion=False, optimizer_impl="foreach")
    normalization = "RMSNorm" if case.get("swiglu") else "LayerNorm"
    spec_layer = uniform_model("cp", 2, HIDDEN, HEADS, SEQ, VOCAB, normalization=normalization).layers[0]
    return GPTModel(config=config, transformer_layer_spec=layer_spec(spec_layer, kernels), vocab_size=VOCAB,
                    max_sequence_length=SEQ, position_embedding_type=case["position"])


def run_cp_model(case: dict) -> dict:
    """One forward and backward of a whole GPT with each rank holding its two chunks of every sequence (the
    world is the CP group): the mean token loss and the gradient, summed over the ranks, as digests that a
    one-rank run of the same case must reproduce (per-parameter norms and random projections)."""
    from megatron_auto.runtime.context_parallel import chunks_of_rank

    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    model = _gpt_on_sdpa(case, world)
    generator = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator)
    batch = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:], "position_ids": torch.arange(SEQ).expand(BATCH, -1)}
    mine = {key: chunks_of_rank(value, rank, world, seq_dim=1) for key, value in batch.items()}
    token_losses = model(mine["tokens"], mine["position_ids"], None, labels=mine["labels"])
    loss = token_losses.float().sum() / (BATCH * SEQ)
    loss.backward()
    grads = [p.grad.flatten() for p in model.parameters()]
    flat = torch.cat(grads + [loss.detach().view(1)])
    torch.distributed.all_reduce(flat)
    norms = [float(g.norm()) for g in flat[:-1].split([g.numel() for g in grads])]
    directions = torch.randn(4, flat.numel() - 1, generator=generator)
    return {"loss": float(flat[-1]), "param_grad_norms": norms, "projections": (directions @ flat[:-1]).tolist(),
            "tokens_per_rank": int(mine["tokens"].numel())}


def _layers(case: dict, fused: bool):
    """(reference layer, layer under test) with the same weights."""
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.transformer.spec_utils import build_module

    from megatron_auto.runtime.kernels import layer_spec, RunKernels

    normalization = "RMSNorm" if case.get("swiglu") else "LayerNorm"
    reference = build_module(gpt_layer_specs.get_gpt_layer_local_spec(normalization=normalization),
                             config=make_config(case), layer_number=1)
    kernels = RunKernels(layer_spec="local", attention=case["attention"], attention_request=case["attention"],
                         bias_activation_fusion=fused, bias_dropout_fusion=fused, optimizer_impl="foreach")
    config = make_config(case, bias_activation_fusion=fused, bias_dropout_fusion=fused)
    spec_layer = uniform_model("kernels", 1, HIDDEN, HEADS, SEQ, 256, normalization=normalization).layers[0]
    layer = build_module(layer_spec(spec_layer, kernels), config=config, layer_number=1)
    layer.load_state_dict(reference.state_dict())
    return reference, layer


@contextlib.contextmanager
def fused_calls():
    """Count the calls of Megatron's fused bias-activation and bias-dropout-add functions."""
    from megatron.core.fusions import fused_bias_dropout
    from megatron.core.transformer import mlp

    calls = {"activation": 0, "bias_dropout_add": 0}
    targets = [(mlp, "bias_gelu_impl", "activation"), (mlp, "bias_swiglu_impl", "activation"),
               (fused_bias_dropout, "bias_dropout_add_fused_train", "bias_dropout_add")]
    originals = [getattr(module, attr) for module, attr, _ in targets]

    def counted(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    for (module, attr, name), original in zip(targets, originals):
        setattr(module, attr, counted(name, original))
    try:
        yield calls
    finally:
        for (module, attr, _), original in zip(targets, originals):
            setattr(module, attr, original)


def run_layer(case: dict) -> dict:
    """Megatron's local layer against the layer on `case`'s kernels: output and gradient errors."""
    reference, layer = _layers(case, case.get("fused", False))
    torch.manual_seed(5)  # the same full hidden states on every TP rank
    hidden = torch.randn(SEQ, BATCH, HIDDEN)
    grad = torch.randn(SEQ, BATCH, HIDDEN)
    outputs = []
    with fused_calls() as calls:
        for module in (reference, layer):
            leaf = hidden.clone().requires_grad_()
            out = module(leaf, attention_mask=None)[0]
            out.backward(grad)
            outputs.append((out.detach(), leaf.grad, {n: p.grad for n, p in module.named_parameters()}))
    (ref, ref_in, ref_params), (got, got_in, got_params) = outputs
    return {"output": relative_error(got, ref), "input_grad": relative_error(got_in, ref_in),
            "param_grad": max(relative_error(got_params[n], g) for n, g in ref_params.items()),
            "core": type(layer.self_attention.core_attention).__name__, "fused_calls": calls}


def run_dropout(case: dict) -> dict:
    """SDPA's dropout on uniform causal attention over values of 1: every output is 1 without dropout,
    and its mean stays 1 with it (kept probabilities are scaled by 1/(1-p))."""
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    _, sdpa = _cores(case)
    sdpa.train()
    heads, groups = sdpa.num_attention_heads_per_partition, sdpa.num_query_groups_per_partition
    seq, batch, width = 128, 4, HIDDEN // HEADS
    query = torch.zeros(seq, batch, heads, width)
    key, value = torch.zeros(seq, batch, groups, width), torch.ones(seq, batch, groups, width)
    default_state = torch.get_rng_state()
    tracker_state = get_cuda_rng_tracker().get_states()["model-parallel-rng"].clone()
    out = sdpa(query, key, value, None)
    sdpa.eval()
    evaluated = sdpa(query, key, value, None)
    gathered = [torch.empty_like(out) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(gathered, out)
    return {"mean": float(out.mean()), "changed_fraction": float((out - 1).abs().gt(1e-6).float().mean()),
            "eval_max_error": float((evaluated - 1).abs().max()),
            "default_rng_untouched": bool(torch.equal(default_state, torch.get_rng_state())),
            "tracker_advanced": not torch.equal(tracker_state, get_cuda_rng_tracker().get_states()["model-parallel-rng"]),
            "ranks_differ": all(not torch.equal(gathered[0], g) for g in gathered[1:]),
            "elements": out.numel()}


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    cases = json.load(open(sys.argv[1]))
    distributed.init_distributed(120.0)
    results = {}
    for case in cases:
        initialize_tp()
        results[case["name"]] = RUNNERS[case["kind"]](case)
        distributed.destroy_parallel_groups()
        results[case["name"]].update(threads_closed=thread_count(), group_threads_closed=group_thread_count())
    if torch.distributed.get_rank() == torch.distributed.get_world_size() - 1:
        json.dump(results, open(sys.argv[2], "w"), indent=1)
    distributed.shutdown()


def _train_with(impl: str, flags: dict):
    """A 3-step run of a tiny GPT on `flags`' layout with the Adam step `impl`: (session, param vector)."""
    from megatron_auto.runtime import session
    from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags

    model = uniform_model("kernels-gpt", 2, HIDDEN, HEADS, SEQ, 256)
    settings = TrainSettings(train_iters=3, lr=1e-3, hidden_dropout=0.0, attention_dropout=0.0, optimizer_impl=impl,
                             timeout_s=120.0, data=DataSettings(vocab_size=256))
    plan = plan_from_flags(model, torch.distributed.get_world_size(), ManualParallelism(**flags))
    run = session.build_session(plan, model, settings, "gloo", torch.device("cpu"))
    session.train(run)
    return run, torch.cat([p.detach().flatten().clone() for chunk in run.model for p in chunk.parameters()])


def _impl_flags(optimizer) -> list:
    from megatron_auto.runtime.kernels import torch_adams

    return sorted({(g["fused"], g["foreach"]) for adam in torch_adams(optimizer) for g in adam.param_groups})


def run_optimizer(case: dict) -> dict:
    """Parameters after 3 steps with the fused and the foreach Adam step; the flags survive a load."""
    foreach_run, foreach_params = _train_with("foreach", case["flags"])
    foreach_flags = _impl_flags(foreach_run.optimizer)
    fused_run, fused_params = _train_with("fused", case["flags"])
    result = {"max_abs_diff": float((fused_params - foreach_params).abs().max()),
              "max_abs_param": float(foreach_params.abs().max()),
              "foreach_flags": foreach_flags, "fused_flags": _impl_flags(fused_run.optimizer)}
    if not case["flags"].get("distributed_optimizer"):
        # A state saved by a foreach run, loaded into the fused run: still fused, a step tensor per parameter.
        fused_run.optimizer.load_state_dict(foreach_run.optimizer.state_dict())
        from megatron_auto.runtime.kernels import torch_adams

        steps = [s["step"] for adam in torch_adams(fused_run.optimizer) for s in adam.state.values()]
        result.update(flags_after_load=_impl_flags(fused_run.optimizer),
                      distinct_steps=len({id(s) for s in steps}) == len(steps),
                      step_values=sorted({float(s) for s in steps}))
    return result


RUNNERS = {"core": run_core, "cp_core": run_cp_core, "cp_model": run_cp_model, "layer": run_layer,
           "dropout": run_dropout, "optimizer": run_optimizer}

if __name__ == "__main__":
    main()
