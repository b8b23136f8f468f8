"""A training session: a Plan, the model and settings in; Megatron-Core objects built and run.

`build_session` does everything that needs process groups (call it on every
rank after `distributed.init_distributed`); `train` runs the loop and logs
Megatron-style lines on the last rank.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ..errors import UserError
from ..plan import Plan
from ..specs.model import ModelSpec
from . import checkpoint, config as configs, data, distributed, faults, kernels, metrics, schedule, stopping
from . import checkpoint_rotation, moe_metrics, mtp_metrics, tensorboard_log, teardown
from . import model as models
from .batch_schedule import BatchSizer, check_divisible
from .layout import MegatronLayout, layout_from_plan
from .optimizer_parts import inner_optimizers, steps_experts
from .settings import TrainSettings
from .step import StepResult, eval_step, sync_parameters, train_step

logger = logging.getLogger(__name__)


@dataclass
class Session:
    """The live objects of one run on this rank."""

    plan: Plan
    layout: MegatronLayout
    model_spec: ModelSpec
    settings: TrainSettings
    device: torch.device
    model: list
    optimizer: Any
    scheduler: Any
    source: Any
    slicer: data.BatchSlicer
    padded_vocab: int
    iteration: int = 0
    history: list = field(default_factory=list)
    """StepResult of every iteration run in this session."""
    hybrid: Any = None
    """hybrid.hybrid_runtime.HybridRuntime for a hybrid-space plan, else None."""
    started_at: float = field(default_factory=time.time)
    """Wall-clock start of the session, for --exit-duration-in-mins."""
    scalars: Any = None
    """tensorboard_log.Sinks of the logging rank with --tensorboard-dir / --wandb-project, else None."""
    sizer: Any = None
    """batch_schedule.BatchSizer: the global batch of each iteration (the plan's, or a growing one)."""
    consumed_samples: int = 0
    """Training samples consumed so far (Megatron-LM's consumed_train_samples)."""
    current_batch: int = 0
    """Global batch of the last iteration run."""
    eval_batches: int = 0
    """Validation global batches consumed so far (Megatron-LM's consumed_valid_samples / global batch):
    each evaluation continues through the validation split where the last one stopped."""


def _scheduler(optimizer, settings: TrainSettings, global_batch_size: int):
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    steps = schedule.schedule_steps(settings, global_batch_size)
    start_wd, end_wd = settings.weight_decay, settings.weight_decay
    if settings.weight_decay_incr_style != "constant":  # Megatron-LM: both given (validation.py checks)
        start_wd, end_wd = settings.start_weight_decay, settings.end_weight_decay
    return OptimizerParamScheduler(
        optimizer, init_lr=settings.lr_warmup_init if steps.warmup else settings.lr, max_lr=settings.lr,
        min_lr=settings.min_lr, lr_warmup_steps=steps.warmup, lr_decay_steps=steps.decay,
        lr_decay_style=settings.lr_decay_style, start_wd=start_wd, end_wd=end_wd,
        wd_incr_steps=steps.weight_decay_increment, wd_incr_style=settings.weight_decay_incr_style,
        wsd_decay_steps=steps.wsd_decay, lr_wsd_decay_style=settings.lr_wsd_decay_style,
        use_checkpoint_opt_param_scheduler=not settings.override_schedule,
        override_opt_param_scheduler=settings.override_schedule)


def use_expert_tp_group_for_grad_norm(optimizer) -> None:
    """Count each expert parameter replicated over TP once per expert-TP group in the gradient norm.

    megatron-core 0.16.1's get_megatron_optimizer gives the experts' optimizer the dense TP group
    (optimizer/__init__.py sets `tp_group` from the TP group for every optimizer), so the norm keeps a
    replicated parameter (an expert's fc2 bias) only on dense TP rank 0: with TP > expert TP, the
    other TP ranks' experts drop out of the norm and clipping (measured: norm 2.4% low at TP2, ETP1,
    tests/runtime/test_moe_equivalence.py). The experts' optimizer is the one over params with
    `allreduce` False (Megatron's expert-parallel marker)."""
    from megatron.core import parallel_state

    for inner in inner_optimizers(optimizer):
        if steps_experts(inner):
            inner.tp_group = parallel_state.get_expert_tensor_parallel_group()


def _attach_sync_functions(transformer_config, model: list) -> None:
    """What the schedules call around gradient accumulation (Megatron-LM's setup_model_and_optimizer)."""
    from megatron.core.distributed import finalize_model_grads

    transformer_config.no_sync_func = [chunk.no_sync for chunk in model]
    if len(model) == 1:
        transformer_config.no_sync_func = transformer_config.no_sync_func[0]
    transformer_config.finalize_model_grads_func = finalize_model_grads


def build_session(plan: Plan, model_spec: ModelSpec, settings: TrainSettings, backend: str,
                  device: torch.device, initial_state=None) -> Session:
    """Process groups, model chunks, DDP, optimizer and schedule for `plan` on this rank."""
    from megatron.core import parallel_state
    from megatron.core.optimizer import get_megatron_optimizer

    settings = schedule.resolve_samples(settings, plan.global_batch_size)
    if plan.space == "hybrid" and settings.batch_ramp is not None:
        raise UserError("--rampup-batch-size / --step-batch-size-schedule: a growing batch runs on megatron-space "
                        "plans only (not --auto-parallel-space hybrid)")
    moe_metrics.reset_aux_loss_tracker()
    mtp_metrics.reset_mtp_loss_tracker()
    if plan.space == "hybrid":
        return _build_hybrid_session(plan, model_spec, settings, backend, device, initial_state)
    layout = layout_from_plan(plan)
    distributed.initialize_parallel(layout, settings.timeout_s)
    models.set_random_seed(settings.seed)
    padded_vocab = configs.padded_vocab_size(settings.data.vocab_size, settings, layout.dims.tp)
    tconfig = configs.transformer_config(model_spec, layout, settings, backend)
    chunks = models.build_chunks(model_spec, layout, settings, tconfig, padded_vocab, device)
    models.check_built_chunks(chunks, tuple(len(chunk.layers) for chunk in plan.chunks), layout.dims.pp)
    chunks = models.wrap_float16(chunks, tconfig)
    model = models.wrap_ddp(chunks, tconfig, configs.ddp_config(layout, settings))
    optimizer = get_megatron_optimizer(configs.optimizer_config(layout, settings), model,
                                       use_gloo_process_groups=False)
    kernels.use_run_optimizer_impl(optimizer, settings)
    use_expert_tp_group_for_grad_norm(optimizer)
    _attach_sync_functions(tconfig, model)
    if optimizer.config.fp16:
        tconfig.grad_scale_func = optimizer.scale_loss
    source = data.open_source(settings, model_spec.seq_length, layout.global_batch_size)
    slicer = data.BatchSlicer(layout, parallel_state.get_data_parallel_rank())
    return Session(plan, layout, model_spec, settings, device, model, optimizer,
                   _scheduler(optimizer, settings, layout.global_batch_size), source, slicer, padded_vocab,
                   sizer=_batch_sizer(settings, layout))


def _batch_sizer(settings: TrainSettings, layout: MegatronLayout) -> BatchSizer:
    """The run's batch sizer; UserError before any work when a batch of the ramp does not split evenly."""
    check_divisible(settings.batch_ramp, layout.global_batch_size, layout.micro_batch_size, layout.dims.dp)
    return BatchSizer(settings.batch_ramp, layout.global_batch_size)


def _build_hybrid_session(plan: Plan, model_spec: ModelSpec, settings: TrainSettings, backend: str,
                          device: torch.device, initial_state=None) -> Session:
    """The hybrid runtime's objects (per-layer layouts) in a Session."""
    from .hybrid import hybrid_runtime as hybrid_session

    layout, model, optimizer, slicer, padded_vocab, runtime = hybrid_session.build(
        plan, model_spec, settings, backend, device, initial_state)
    source = data.open_source(settings, model_spec.seq_length, layout.global_batch_size)
    return Session(plan, layout, model_spec, settings, device, model, optimizer,
                   _scheduler(optimizer, settings, layout.global_batch_size), source, slicer, padded_vocab,
                   hybrid=runtime, sizer=BatchSizer(None, layout.global_batch_size))


def resume(session: Session, path: Optional[str] = None, step: Optional[int] = None) -> None:
    """Load `path` (default: settings.load, or settings.pretrained_checkpoint's weights where that holds no
    checkpoint) at `step` (default: settings.ckpt_step or the latest); a directory without a checkpoint leaves
    the run at iteration 0 (Megatron-LM warns and starts from scratch)."""
    root, weights_only = path or session.settings.load, session.settings.finetune
    step = step if step is not None else session.settings.ckpt_step
    if path is None and session.settings.pretrained_checkpoint:
        root, weights_only = _finetune_source(session.settings, weights_only)
    resumed = checkpoint.load_checkpoint(root, session.model, session.optimizer, session.scheduler,
                                         weights_only=weights_only, step=step,
                                         with_optimizer=session.settings.load_optimizer,
                                         with_rng=session.settings.load_rng,
                                         required=session.settings.exit_on_missing_checkpoint,
                                         non_persistent=None if path else session.settings.non_persistent_dir(root))
    if resumed is not None:
        session.iteration = resumed.iteration
        session.consumed_samples = resumed.consumed_samples
        session.eval_batches = eval_batches_before(resumed.iteration, session.settings)


def _finetune_source(settings: TrainSettings, finetune: bool) -> tuple[str, bool]:
    """(directory, weights only) to start from with --pretrained-checkpoint: --load where it holds a checkpoint
    (a restart resumes as usual), else the pretrained weights (Megatron-LM sets --finetune then)."""
    if settings.load and checkpoint.checkpoints_to_try(settings.load,
                                                       non_persistent=settings.non_persistent_dir(settings.load)):
        return settings.load, finetune
    pretrained = settings.pretrained_checkpoint
    if not checkpoint.load_candidates(pretrained):
        where = (f"neither --load {settings.load} nor --pretrained-checkpoint {pretrained} holds one" if settings.load
                 else f"--pretrained-checkpoint {pretrained} holds none")
        raise UserError(f"no checkpoint to start from: {where}")
    if torch.distributed.get_rank() == 0:
        logger.info("no checkpoint in --load %s: fine-tuning from the weights of --pretrained-checkpoint %s",
                    settings.load, pretrained)
    return pretrained, True


def eval_batches_before(iteration: int, settings: TrainSettings) -> int:
    """Validation batches the periodic evaluations of iterations 1..`iteration` consumed (Megatron-LM's
    consumed_valid_samples on resume: iteration // eval_interval x eval_iters, in global batches)."""
    if not settings.eval_interval or settings.eval_iters <= 0:
        return 0
    return iteration // settings.eval_interval * settings.eval_iters


def iteration_layout(session: Session) -> MegatronLayout:
    """The layout of the next iteration: the plan's, with the global batch and micro-batch count of a
    growing batch's current size."""
    if session.settings.batch_ramp is None:
        return session.layout
    batch = session.sizer.batch(session.consumed_samples)
    per_micro_batch = session.layout.micro_batch_size * session.layout.dims.dp
    return dataclasses.replace(session.layout, global_batch_size=batch, num_micro_batches=batch // per_micro_batch)


def run_iteration(session: Session) -> StepResult:
    """Train on the next global batch."""
    layout = iteration_layout(session)
    slicer = session.slicer if layout is session.layout else dataclasses.replace(session.slicer, layout=layout)
    first = session.consumed_samples if session.settings.batch_ramp is not None else None
    iterators = data.iterators_for_chunks(session.source, slicer, session.iteration, session.device,
                                          first_sample=first)
    result = train_step(session.model, session.optimizer, session.scheduler, iterators, layout,
                        session.model_spec.seq_length, session.device, hybrid=session.hybrid)
    session.iteration += 1
    if first is None:
        session.consumed_samples = session.iteration * layout.global_batch_size
    else:
        session.consumed_samples = first + layout.global_batch_size
    session.current_batch = layout.global_batch_size
    session.history.append(result)
    return result


def evaluate(session: Session) -> Optional[float]:
    """Mean loss over the next `eval_iters` validation global batches (None with --eval-iters 0): as
    Megatron-LM's validation iterator, each evaluation goes on where the previous one stopped."""
    if session.settings.eval_iters <= 0:
        return None
    losses = []
    for _ in range(session.settings.eval_iters):
        iterators = data.iterators_for_chunks(session.source, session.slicer, session.eval_batches, session.device,
                                              split="eval")
        losses.append(eval_step(session.model, iterators, session.layout, session.model_spec.seq_length,
                                session.device, hybrid=session.hybrid))
        session.eval_batches += 1
    return sum(losses) / len(losses)


def is_logging_rank() -> bool:
    """The last rank: it sits on the last pipeline stage, where the losses are."""
    return torch.distributed.get_rank() == torch.distributed.get_world_size() - 1


def _log_iteration(session: Session, result: StepResult, elapsed_s: float, flops: float) -> None:
    """Megatron's iteration line; `flops`: of one iteration at the plan's global batch."""
    batch = session.current_batch or session.layout.global_batch_size
    tokens = batch * session.model_spec.seq_length
    flops *= batch / session.layout.global_batch_size
    world = torch.distributed.get_world_size()
    line = metrics.format_iteration(metrics.IterationLog(
        iteration=session.iteration, train_iters=session.settings.train_iters,
        consumed_samples=session.consumed_samples, elapsed_s=elapsed_s,
        learning_rate=session.optimizer.param_groups[0]["lr"], global_batch_size=batch,
        loss=result.loss, grad_norm=result.grad_norm, tokens_per_s=tokens / elapsed_s,
        tflops_per_gpu=flops / elapsed_s / world / 1e12, skipped=int(result.skipped),
        loss_scale=result.loss_scale, extra_losses=result.extra_losses))
    logger.info(line)
    if session.scalars is not None:
        session.scalars.iteration(session.iteration, result, session.optimizer.param_groups[0]["lr"],
                                  tokens / elapsed_s)


def _maybe_save(session: Session, last: bool) -> None:
    """Save at --save-interval, at the end, and before a growing batch grows (Megatron-LM saves when the
    micro-batch count changes); else at --non-persistent-save-interval, to the non-persistent folder."""
    settings = session.settings
    if not settings.save:
        return
    periodic = settings.save_interval and session.iteration % settings.save_interval == 0
    grows = settings.batch_ramp is not None and session.sizer.batch(session.consumed_samples) != session.current_batch
    if periodic or last or grows:
        previous = checkpoint.tracked_iteration(settings.save)
        _save_to(session, settings.save)
        checkpoint_rotation.retire_previous(settings.save, previous, session.iteration, settings.save_retain_interval)
    elif settings.non_persistent_save_dir and session.iteration % settings.non_persistent_save_interval == 0:
        checkpoint_rotation.clear_for_non_persistent_save(settings.non_persistent_save_dir)
        _save_to(session, settings.non_persistent_save_dir)


def save_now(session: Session) -> None:
    """Save this iteration to --save (unless its latest checkpoint is this iteration's): the checkpoint that a
    re-planned session resumes from (runtime.stragglers)."""
    settings = session.settings
    previous = checkpoint.tracked_iteration(settings.save)
    if previous != session.iteration:
        _save_to(session, settings.save)
        checkpoint_rotation.retire_previous(settings.save, previous, session.iteration, settings.save_retain_interval)


def _save_to(session: Session, root: str) -> None:
    settings = session.settings
    checkpoint.save_checkpoint(root, session.model, session.optimizer, session.scheduler, session.iteration,
                               session.consumed_samples, with_optimizer=settings.save_optimizer,
                               with_rng=settings.save_rng)


def stop_iteration(settings: TrainSettings) -> int:
    """The iteration this run stops at: train_iters, or exit_interval when sooner."""
    return min(settings.train_iters, settings.exit_interval or settings.train_iters)


def _validate(session: Session, where: str) -> None:
    """Evaluate and log Megatron's validation line (nothing with --eval-iters 0)."""
    loss = evaluate(session)
    if loss is not None and is_logging_rank():
        logger.info(metrics.format_eval(session.iteration, loss, where))
        if session.scalars is not None:
            session.scalars.validation(session.iteration, loss)


def train(session: Session, run: Optional[Callable[[Session], StepResult]] = None,
          after_iteration: Optional[Callable[[Session, StepResult], None]] = None) -> list[StepResult]:
    """Run from session.iteration to train_iters (or exit_interval), logging, evaluating and saving;
    then, having reached train_iters, a last validation pass (Megatron-LM's end-of-training one).

    `run` replaces run_iteration (runtime.oom.OomGuard); `after_iteration` is called after each
    iteration (runtime.memory_check.MemoryCheck). A NaN loss or gradient raises
    stopping.TrainingDiverged (with --check-for-nan-in-loss-and-grad, the default); past
    --exit-duration-in-mins, or once --exit-signal-handler's signal has come, the run saves (with
    --save) and stops."""
    settings = session.settings
    stop = stop_iteration(settings)
    flops = metrics.model_flops_per_iteration(session.model_spec, session.layout.global_batch_size,
                                              session.padded_vocab)
    results = []
    if session.scalars is None and is_logging_rank():
        session.scalars = tensorboard_log.open_sinks(settings)
    with stopping.exit_signal(settings.exit_signal) as exit_signal:
        while session.iteration < stop:
            start = time.perf_counter()
            result = (run or run_iteration)(session)
            elapsed = time.perf_counter() - start
            results.append(result)
            if settings.check_for_nan:
                stopping.check_for_nan(result, session.iteration, session.device)
            if is_logging_rank() and session.iteration % max(1, settings.log_interval) == 0:
                _log_iteration(session, result, elapsed, flops)
            if settings.eval_interval and session.iteration % settings.eval_interval == 0:
                _validate(session, "")
            reason = _early_exit(session, exit_signal)
            if reason is not None:
                _maybe_save(session, last=True)
                sync_parameters(session.model)
                if is_logging_rank():
                    logger.info("exiting %s at iteration %d", reason, session.iteration)
                return results
            _maybe_save(session, last=session.iteration == stop)
            faults.maybe_inject(session.iteration)
            if after_iteration is not None:
                after_iteration(session, result)
    sync_parameters(session.model)
    if session.iteration == settings.train_iters:
        _validate(session, " on validation set (end of training)")
    return results


def _early_exit(session: Session, exit_signal: Optional[stopping.ExitSignal]) -> Optional[str]:
    """Why every rank stops after this iteration (None: it goes on)."""
    if stopping.duration_exceeded(session.started_at, session.settings.exit_duration_s, session.device):
        return f"after {(time.time() - session.started_at) / 60:.2f} minutes (--exit-duration-in-mins)"
    if exit_signal is not None and exit_signal.agreed(session.device):
        return f"on {exit_signal.name} (--exit-signal-handler)"
    return None


def close(session: Session) -> None:
    """End `session` on this rank: drop its model, optimizer and data, and destroy the process groups it built
    (Megatron's and the hybrid runtime's), their threads with them. The job's default group stays for the
    next session (a re-plan, a test's next case); distributed.shutdown ends it."""
    teardown.forget_autograd_graphs(session.model)
    moe_metrics.reset_aux_loss_tracker()  # its entries hold the routers' reduce groups
    mtp_metrics.reset_mtp_loss_tracker()
    for name in ("model", "optimizer", "scheduler", "source", "slicer", "hybrid"):
        setattr(session, name, None)
    distributed.destroy_parallel_groups()  # it collects the dropped model's reference cycles too
