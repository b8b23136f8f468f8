"""One rank of an equivalence launch: run several parallel layouts of the same tiny GPT in turn.

Usage (per rank, RANK/WORLD_SIZE/MASTER_* set): python equivalence_worker.py CASES.json RESULTS.json
Each case: {"name", "flags": ManualParallelism fields, "steps", optional "model" ("gpt", "gpt6", "llama", "qwen3",
"swiglu_moe", "mixed_moe", "deepseek_moe", "mla", "mla_no_q_lora", "mtp" or "mtp_untied"), "moe" (MoESettings
fields, e.g. token_dispatcher), optional "load_weights" (checkpoint dir, weights only), "resume" (checkpoint dir,
full state), "save" + "save_interval", "force_batch_p2p", "hybrid" (a hybrid plan instead of the flags' layout:
{"chunks": [[LayerStrategy fields, ...], ...], "embedding": {...}, "micro_batches"}, at the flags' global
batch), "save_state" / "init_state" (a single-process GPTModel state dict written before training / a
hybrid plan's starting weights), "settings" (TrainSettings fields, e.g. precision, attention_backend),
"softmax_scale_factor" (a broken run: MLA's softmax scale multiplied by it), "mtp_scale_factor" (a broken run: the
MTP loss's backward scale multiplied by it), "data_vocab_size" (mock tokens
drawn from fewer ids than the padded vocabulary, so that training
has something to learn), "drop_grad_sync" (a broken run: DDP's gradient reduction skipped), "fp32_only" (no
bf16 twin; read by the test)}.
The last rank writes {name: {"iterations", "losses", "grad_norms", "loss_scales", "skipped",
"param_dtypes", "moe_losses", "router_gap", "expert_bias_max", "attention", "mtp_losses", "mtp_backward_scales",
"params_without_grad", "mtp_params_with_grad", "shared_expert_overlap_layers"} or {"error"}, with "seconds" the
case took, "threads" the process held at its end (its session alive) and "threads_closed" after session.close}
to RESULTS.json;
router_gap is the smallest margin, over every token routed on this rank, between what its router picked and
the best it left (selection_margin; MoE models); expert_bias_max the largest expert bias on this rank after
the case (--moe-router-enable-expert-bias); attention the "attention/core" classes of its layers.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
import time

import patches

patches.apply_all()

from megatron_auto.plan import Chunk, LayerStrategy, Plan  # noqa: E402
from megatron_auto.runtime import distributed, session  # noqa: E402
from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags  # noqa: E402
from megatron_auto.runtime.settings import DataSettings, MoESettings, TrainSettings  # noqa: E402
from megatron_auto.specs.model import uniform_model  # noqa: E402
from tests.runtime.worker_stats import thread_count  # noqa: E402
from tests.runtime.worker_models import (deepseek_style_moe_model, llama_model, mixed_moe_model,  # noqa: E402
                                         mla_model, mtp_model, qwen3_model, swiglu_moe_model)

MODEL = uniform_model("equivalence-gpt", num_layers=4, hidden_size=64, num_attention_heads=4,
                      seq_length=32, vocab_size=256)
MODELS = {"gpt": MODEL, "gpt6": uniform_model("equivalence-gpt6", num_layers=6, hidden_size=64, num_attention_heads=4,
                                             seq_length=32, vocab_size=256),
          "llama": llama_model("equivalence-llama"), "qwen3": qwen3_model("equivalence-qwen3"),
          "swiglu_moe": swiglu_moe_model("equivalence-swiglu-moe"),
          "mixed_moe": mixed_moe_model("equivalence-mixed-moe"),
          "deepseek_moe": deepseek_style_moe_model("equivalence-deepseek-moe"),
          "mla": mla_model("equivalence-mla"), "mla_no_q_lora": mla_model("equivalence-mla-no-q-lora", None),
          "mtp": mtp_model("equivalence-mtp"), "mtp_untied": mtp_model("equivalence-mtp-untied", untie=True)}
SETTINGS = TrainSettings(train_iters=5, lr=1e-3, hidden_dropout=0.0, attention_dropout=0.0, clip_grad=1.0,
                         weight_decay=0.01, seed=1234, timeout_s=90.0, data=DataSettings(vocab_size=256))


def run_case(case: dict, info) -> tuple[dict, object]:
    """The case's results and its session (still open)."""
    import torch

    settings = dataclasses.replace(SETTINGS, train_iters=case.get("steps", 5), save=case.get("save"),
                                   save_interval=case.get("save_interval", 0), **case.get("settings", {}),
                                   data=DataSettings(vocab_size=case.get("data_vocab_size", 256)),
                                   moe=MoESettings(**case.get("moe", {})))
    world = torch.distributed.get_world_size()
    model = MODELS[case.get("model", "gpt")]
    flags = ManualParallelism(**case["flags"])
    if case.get("hybrid"):
        plan = hybrid_plan(case["hybrid"], world, flags.global_batch_size)
        state = torch.load(case["init_state"], weights_only=True)
        run = session.build_session(plan, model, settings, info.backend, info.device, initial_state=state)
    else:
        run = session.build_session(plan_from_flags(model, world, flags), model, settings, info.backend, info.device)
    if case.get("save_state"):
        torch.save(run.model[0].module.state_dict(), case["save_state"])
    if case.get("force_batch_p2p"):
        for chunk in run.model:
            chunk.config.batch_p2p_comm = True
    if case.get("drop_grad_sync"):  # a negative control: data-parallel gradients never reduced
        for chunk in run.model:
            chunk.finish_grad_sync = lambda **_: None
    if case.get("softmax_scale_factor"):  # a negative control: MLA's core attention on another softmax scale
        _scale_softmax(run.model, case["softmax_scale_factor"])
    if case.get("save_initial"):
        from megatron_auto.runtime import checkpoint
        checkpoint.save_checkpoint(case["save_initial"], run.model, run.optimizer, run.scheduler, 0, 0)
    if case.get("load_weights"):
        _load_weights(run, case["load_weights"])
    if case.get("resume"):
        session.resume(run, case["resume"], case.get("resume_step"))
    first = run.iteration
    gaps = _record_router_gaps(run.model)
    with _mtp_loss_scales(case.get("mtp_scale_factor", 1.0)) as mtp_scales:
        results = session.train(run)
    return _report(run, results, gaps, mtp_scales, first), run


def _report(run, results, gaps, mtp_scales, first: int) -> dict:
    """What the test reads of a case's run."""
    return {**_mtp_report(run.model, results, mtp_scales),"iterations": list(range(first + 1, run.iteration + 1)),
            "losses": [r.loss for r in results], "grad_norms": [r.grad_norm for r in results],
            "loss_scales": [r.loss_scale for r in results], "skipped": [r.skipped for r in results],
            "param_dtypes": sorted({str(p.dtype) for chunk in run.model for p in chunk.parameters()}),
            "wgrad_fused_linears": sum(bool(getattr(m, "gradient_accumulation_fusion", False))
                                       for chunk in run.model for m in chunk.modules()),
            "moe_losses": [dict(r.moe_losses) for r in results], "router_gap": min(gaps, default=None),
            "expert_bias_max": max((float(m.expert_bias.abs().max()) for chunk in run.model for m in chunk.modules()
                                    if getattr(m, "expert_bias", None) is not None), default=None),
            "cp_size": _context_parallel_size(),
            "shared_expert_overlap_layers": sum(bool(getattr(m, "shared_expert_overlap", False))
                                                for chunk in run.model for m in chunk.modules()),
            "attention": sorted({f"{type(m).__name__}/{type(m.core_attention).__name__}" for chunk in run.model
                                 for m in chunk.modules() if hasattr(m, "core_attention")})}


def _scale_softmax(model, factor: float) -> None:
    """Multiply the softmax scale of every MLA layer's core attention (unfused: softmax_scale; SDPA: the
    kernel's scale) by `factor`, as a core that took 1/sqrt(qk_head_dim) for MLA's scale would."""
    from megatron.core.transformer.multi_latent_attention import MultiLatentAttention

    for attention in (m for chunk in model for m in chunk.modules() if isinstance(m, MultiLatentAttention)):
        core = attention.core_attention
        core.softmax_scale *= factor
        if hasattr(core, "kernel_scale"):
            core.kernel_scale *= factor


@contextlib.contextmanager
def _mtp_loss_scales(factor: float):
    """Record every MTP loss backward scale the schedule sets (MTPLossAutoScaler.set_loss_scale), multiplied by
    `factor` (a negative control: a wrong MTP scale); upstream's setter is back afterwards."""
    from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler

    upstream, scales = MTPLossAutoScaler.set_loss_scale, []

    def set_loss_scale(scale):
        scales.append(float(scale))
        upstream(scale * factor)
    MTPLossAutoScaler.set_loss_scale = staticmethod(set_loss_scale)
    try:
        yield scales
    finally:
        MTPLossAutoScaler.set_loss_scale = staticmethod(upstream)


def _mtp_report(model, results, scales: list) -> dict:
    """The MTP losses per step, the backward scales set (consecutive repeats dropped), and on this rank the
    parameters that take gradients and got none in the last step (zero main_grad; the last rank holds the MTP
    module) and how many MTP parameters got one."""
    grads = {name: param.main_grad for chunk in model for name, param in chunk.named_parameters()
             if param.requires_grad}
    return {"mtp_losses": [dict(r.mtp_losses) for r in results],
            "mtp_backward_scales": [s for i, s in enumerate(scales) if i == 0 or s != scales[i - 1]],
            "params_without_grad": sorted(name for name, grad in grads.items() if not bool(grad.abs().sum() > 0)),
            "mtp_params_with_grad": sum(".mtp." in name and bool(grad.abs().sum() > 0) for name, grad in grads.items())}


def _context_parallel_size() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_context_parallel_world_size()


def hybrid_plan(spec: dict, world: int, global_batch: int) -> Plan:
    """A hybrid Plan from a compact case description (one pipeline stage per chunk)."""
    chunks = tuple(Chunk(tuple(LayerStrategy(**s) for s in layers)) for layers in spec["chunks"])
    return Plan(space="hybrid", world_size=world, pipeline_parallel=len(chunks), global_batch_size=global_batch,
                num_micro_batches=spec.get("micro_batches", 2), chunks=chunks,
                embedding=LayerStrategy(**spec["embedding"]))


def _record_router_gaps(model) -> list:
    """Wrap every MoE router's gating so each call appends its smallest selection margin to the returned list."""
    from megatron.core.transformer.moe.router import TopKRouter

    gaps: list = []
    for module in (m for chunk in model for m in chunk.modules() if isinstance(m, TopKRouter)):
        def gating(input, _gating=module.gating, _router=module):
            logits = _gating(input)
            gaps.append(selection_margin(logits.detach().float().view(-1, logits.shape[-1]), _router))
            return logits
        module.gating = gating
    return gaps


def selection_margin(logits, router) -> float:
    """The smallest gap, over these tokens, between what the router picks and the best it does not pick.

    The choice is made on the scores plus the expert bias (sigmoid scores; softmax: the logits, or their
    softmax with --moe-router-pre-softmax):
    under group-limited routing first among the groups (each scored by the sum of its top topk/group_topk),
    then among the chosen groups' experts (megatron-core 0.16.1, moe_utils.topk_routing_with_score_function)."""
    import torch

    config, k = router.config, router.topk
    if config.moe_router_score_function == "sigmoid":
        scores = torch.sigmoid(logits)
    else:  # softmax after the top-k picks on the logits; before it, the same order, but groups sum these
        scores = torch.softmax(logits, dim=-1) if config.moe_router_pre_softmax else logits
    if router.expert_bias is not None:
        scores = scores + router.expert_bias.float()
    margins = []
    if config.moe_router_num_groups:
        groups, picked = config.moe_router_num_groups, config.moe_router_group_topk
        group_scores = scores.view(len(scores), groups, -1).topk(k // picked, dim=-1).values.sum(-1)
        if picked < groups:
            top = group_scores.topk(picked + 1, dim=-1).values
            margins.append(top[:, picked - 1] - top[:, picked])
        chosen = torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, group_scores.topk(picked).indices, True)
        scores = scores.masked_fill(~chosen.repeat_interleave(scores.shape[1] // groups, dim=1), float("-inf"))
    if int(torch.isfinite(scores).sum(-1).min()) > k:  # more candidates than picks
        top = scores.topk(k + 1, dim=-1).values
        margins.append(top[:, k - 1] - top[:, k])
    return min((float(m.min()) for m in margins), default=float("inf"))


def _load_weights(run, path: str) -> None:
    from megatron_auto.runtime import checkpoint

    checkpoint.load_checkpoint(path, run.model, run.optimizer, run.scheduler, weights_only=True)


def run_and_close(case: dict, info) -> dict:
    """Run the case (its error, when it expects one) and note the threads, then close its session: here, where
    no local of run_case still holds a part of the model; a case that failed has its groups destroyed."""
    run = None
    try:
        out, run = run_case(case, info)
    except Exception as error:  # reported per case; the test decides whether it was expected
        if not case.get("expect_error"):
            raise
        out = {"error": f"{type(error).__name__}: {error}"}
    out["threads"] = thread_count()
    if run is not None:
        session.close(run)
    else:
        distributed.destroy_parallel_groups()
    return out


def _only_interval_saves() -> None:
    """A case with "save" writes its checkpoint at its save_interval only. session.train also saves at the last
    iteration (as Megatron-LM does), but every case that resumes reads the save_interval's checkpoint
    (resume_step) and none the last one: that save was work no test read."""
    upstream = session._maybe_save
    session._maybe_save = lambda run, last: upstream(run, last=last and not run.settings.save_interval)


def main() -> None:
    import torch

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    _only_interval_saves()
    cases = json.load(open(sys.argv[1]))
    info = distributed.init_distributed(SETTINGS.timeout_s)
    results = {}
    for case in cases:
        started = time.monotonic()
        results[case["name"]] = out = run_and_close(case, info)
        out.update(seconds=time.monotonic() - started, threads_closed=thread_count())
    if torch.distributed.get_rank() == torch.distributed.get_world_size() - 1:
        json.dump(results, open(sys.argv[2], "w"), indent=1)
    distributed.shutdown()


if __name__ == "__main__":
    main()
