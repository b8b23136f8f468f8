"""Save and resume through Megatron-Core distributed checkpointing.

Tensors are saved as global ShardedTensors (keys name global layers), and the
distributed optimizer uses the `fully_reshardable` format, so a checkpoint
written under one TP/PP/DP layout and world size loads under any other.

Nothing is lost or half-read:
- an iteration is complete only when every rank has written its part: rank 0 then
  writes the directory's `complete` marker, and only after it the tracker
  (`latest_checkpointed_iteration.txt`), each atomically (temporary file, fsync, rename);
- `--load` takes the newest complete iteration (or the tracker's), of its folder or of the folder of
  global non-persistent checkpoints (runtime/checkpoint_rotation.py), and when it cannot be
  read (a truncated or missing shard, a bad metadata file) falls back to the next newest
  with one line saying so, or stops with one line when none loads;
- every rank's random streams are saved beside the tensors (runtime/rng_state.py), and the
  data position is the iteration, so a resume under the same plan is bit-identical.

Either runtime reads the other's checkpoints, and the stock runtime reads its own across a change
between one optimizer and an experts' optimizer of their own: the reading template takes the
stored keys (runtime/saved_layout.py) and, where Megatron's optimizer state would not match what
was written, reads the optimizer state per parameter (runtime/model_space_optimizer.py).
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from typing import Optional

import torch

from ..errors import UserError
from . import rng_state
from .model_space_optimizer import OPTIMIZER_METADATA, ModelSpaceOptimizerState
from .optimizer_parts import has_expert_optimizer, inner_optimizers, optimizer_kind
from .saved_layout import (CHECKPOINT_FORMAT, EXPERT_OPTIMIZER, STOCK_FORMAT, OptimizerKeys, SavedLayout,
                           read_saved_layout)

logger = logging.getLogger(__name__)

TRACKER = "latest_checkpointed_iteration.txt"
COMPLETE = "complete"
"""Marker file of an iteration directory that every rank finished writing."""
_ITERATION_DIR = re.compile(r"iter_(\d{7})")


@dataclass(frozen=True)
class Resumed:
    """Where a loaded checkpoint leaves the run."""

    iteration: int
    consumed_samples: int


def iteration_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}")


class StockFormat:
    """What a checkpoint holds for the stock runtime's model chunks: Megatron-LM's own layout.

    `per_layer_keys` builds the layers' keys one per layer (a hybrid checkpoint's, runtime/saved_layout.py);
    `optimizer_keys` reads the optimizer state per parameter in model space from those stored keys, for a
    checkpoint whose optimizer state Megatron's own would not match: a hybrid one, or one written with the
    experts under an optimizer of their own when this run has none, or the reverse, or by another of
    Megatron's optimizers (distributed, 16-bit, fp32: a run that changes --use-distributed-optimizer or its
    precision, or a re-planned ZeRO level)."""

    format = STOCK_FORMAT
    validates_access = True

    def __init__(self, model: list, per_layer_keys: bool = False, optimizer_keys=None,
                 optimizer_mismatch: Optional[str] = None) -> None:
        self.model = model
        self.per_layer_keys = per_layer_keys
        self.optimizer_keys = optimizer_keys
        self.sharded_by_param: dict[int, object] = {}
        self.model_space: Optional[ModelSpaceOptimizerState] = None
        """The per-parameter optimizer state of the last optimizer_state, when it reads in model space."""
        self.optimizer_mismatch = optimizer_mismatch
        """Why the optimizer state of a stock checkpoint is read per parameter (_optimizer_mismatch)."""

    def model_state(self) -> dict:
        """Chunk state dicts under Megatron-LM's keys (`model`, or `model0`, `model1`, ... with virtual stages)."""
        from megatron.core.dist_checkpointing.dict_utils import nested_values
        from megatron.core.dist_checkpointing.utils import extract_sharded_tensors_and_factories

        from megatron.core import parallel_state

        # Megatron-LM's metadata carries the DP x CP group (checkpointing._build_sharded_state_dict_metadata):
        # GPTModel reads it directly for the MTP stage's embedding copy.
        metadata = {"dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
        if self.per_layer_keys:
            metadata["non_homogeneous_layers"] = True
        state = {key: chunk.module.sharded_state_dict(metadata=dict(metadata))
                 for key, chunk in zip(_chunk_keys(self.model), self.model)}
        tensors, _ = extract_sharded_tensors_and_factories(state)
        self.sharded_by_param = {id(sharded.data): sharded for sharded in nested_values(tensors)}
        return state

    def load_passes(self) -> list:
        """One dist_checkpointing.load reads everything (HybridFormat.load_passes says when it cannot)."""
        return [None]

    def select(self, selection) -> None:
        """Nothing to select: the one load pass takes every chunk."""

    def load_model(self, loaded: dict) -> None:
        for key, chunk in zip(_chunk_keys(self.model), self.model):
            chunk.module.load_state_dict(loaded[key])

    def _model_space(self) -> Optional[ModelSpaceOptimizerState]:
        if self.optimizer_keys is None:
            return None
        return ModelSpaceOptimizerState(self.sharded_by_param, self.optimizer_keys)

    def optimizer_state(self, optimizer, model_state: dict, is_loading: bool) -> dict:
        self.model_space = self._model_space()
        if self.model_space is not None:
            return self.model_space.state(optimizer, model_state, is_loading)
        # Nested as it is: with virtual stages the chunks' dicts share top-level names (`decoder`, ...), and
        # megatron-core finds each parameter's ShardedTensor through nested_values.
        return optimizer.sharded_state_dict(model_state, is_loading=is_loading, metadata=OPTIMIZER_METADATA)

    def load_optimizer(self, optimizer, loaded: dict) -> None:
        model_space = self._model_space()
        if model_space is not None:
            model_space.load(optimizer, loaded)
            return
        restore_zero_adam_step(loaded)
        optimizer.load_state_dict(loaded)

    def random_streams(self) -> list:
        return []


def restore_zero_adam_step(state) -> None:
    """Put back the Adam step 0 that megatron-core left out of a checkpoint.

    megatron-core 0.16.1 writes a non-distributed optimizer's shared step only `if step:`
    (optimizer.py, MixedPrecisionOptimizer and FP32Optimizer `sharded_state_dict`), so a
    checkpoint saved before the first update (every fp16 iteration skipped by the loss
    scale's back-off) has per-parameter state without a step, which torch's Adam refuses
    to load (`KeyError: 'step'`). Zero is the value that was dropped.
    """
    if isinstance(state, (list, tuple)):
        for part in state:
            restore_zero_adam_step(part)
        return
    if not isinstance(state, dict):
        return
    per_param = state.get("state")
    if isinstance(per_param, dict) and isinstance(state.get("param_groups"), list):
        entries = [entry for key, entry in per_param.items() if key != "common_step" and isinstance(entry, dict)]
        adam = entries and all("exp_avg" in entry for entry in entries)
        if adam and "common_step" not in per_param and not any("step" in entry for entry in entries):
            per_param["common_step"] = torch.zeros((), dtype=torch.float32)
        return
    for value in state.values():
        restore_zero_adam_step(value)


def checkpoint_format(model: list, optimizer=None, saved: Optional[SavedLayout] = None):
    """The format object of these model chunks, the hybrid runtime's or the stock one: writing this
    runtime's own layout, or, with `saved`, reading the checkpoint of that layout whichever runtime
    wrote it."""
    from .hybrid.model import HybridChunk

    if model and isinstance(model[0], HybridChunk):
        from .hybrid.checkpoint_state import HybridFormat

        return HybridFormat(model, saved)
    if saved is None:
        return StockFormat(model)
    reason = _optimizer_mismatch(saved, optimizer)
    per_parameter = reason is not None or saved.format != STOCK_FORMAT
    return StockFormat(model, per_layer_keys=not saved.layers_stacked,
                       optimizer_keys=OptimizerKeys(saved.stored_keys) if per_parameter else None,
                       optimizer_mismatch=reason)


def _optimizer_mismatch(saved: SavedLayout, optimizer) -> Optional[str]:
    """Why Megatron's own optimizer state would not read the stock checkpoint `saved` (then it is read per
    parameter in model space); None when it would. The same answer on every rank."""
    expert_optimizer = _on_any_rank(has_expert_optimizer(optimizer))
    if saved.expert_optimizer not in (None, expert_optimizer):
        return f"written with {'an' if saved.expert_optimizer else 'no'} optimizer for the experts"
    kind = optimizer_kind(optimizer)
    if saved.optimizer_kind not in (None, kind):
        return f"written by Megatron's {saved.optimizer_kind} optimizer, read into this run's {kind} one"
    return None


def _ensure_adam_state(optimizer) -> None:
    """Give every parameter Adam state (zeros, step 0) so a loading template has all the keys, and a
    save before the first update (fp16's skipped steps, a batch ramp-up) has a state to write.

    Megatron-LM creates this state with apex/TE's fused Adam; torch's Adam creates
    it lazily at the first step, and the distributed optimizer's state_dict needs it.
    Zeros at step 0 are what torch's first step would create, so training is unchanged.
    """
    for inner in inner_optimizers(optimizer):
        torch_optimizer = getattr(inner, "optimizer", None)
        if torch_optimizer is None:
            continue
        for group in torch_optimizer.param_groups:
            for param in group["params"]:
                state = torch_optimizer.state[param]
                if not state:
                    # torch's fused/capturable Adam keeps the step on the parameter's device.
                    on_device = group.get("fused") or group.get("capturable")
                    state["step"] = torch.zeros((), dtype=torch.float32, device=param.device if on_device else None)
                    state["exp_avg"] = torch.zeros_like(param.data)
                    state["exp_avg_sq"] = torch.zeros_like(param.data)


def _full_state(layout, optimizer, scheduler, iteration: int, consumed: int, with_optimizer: bool,
                is_loading: bool) -> dict:
    """`layout`: checkpoint_format's object for the run's model chunks."""
    state = layout.model_state()
    if with_optimizer:
        _ensure_adam_state(optimizer)
        state["optimizer"] = layout.optimizer_state(optimizer, state, is_loading)
        state["opt_param_scheduler"] = scheduler.state_dict()
    state["iteration"] = iteration
    state["consumed_samples"] = consumed
    state[EXPERT_OPTIMIZER] = _on_any_rank(has_expert_optimizer(optimizer))
    state[CHECKPOINT_FORMAT] = layout.format
    return state


def path_problem(save: Optional[str], load: Optional[str], non_persistent: Optional[str] = None) -> Optional[str]:
    """Why this rank cannot use --save or the non-persistent checkpoints' folder (created if missing, must take
    a file), or --load; None when it can."""
    for flag, folder in (("--save", save), ("--non-persistent-global-ckpt-dir", non_persistent)):
        problem = _unwritable(flag, folder) if folder else None
        if problem:
            return problem
    if load and os.path.exists(load) and not os.path.isdir(load):
        return f"--load {load}: exists and is not a directory"
    if load and os.path.isdir(load) and not os.access(load, os.R_OK | os.X_OK):
        return f"--load {load}: cannot read that directory"
    return None


def _unwritable(flag: str, folder: str) -> Optional[str]:
    if os.path.exists(folder) and not os.path.isdir(folder):
        return f"{flag} {folder}: exists and is not a directory"
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return f"{flag} {folder}: cannot write there ({error.strerror or type(error).__name__})"
    return None


def check_paths(save: Optional[str], load: Optional[str], non_persistent: Optional[str] = None) -> None:
    """Before any work, on every rank: UserError on all ranks when any rank cannot use its paths."""
    problem = path_problem(save, load, non_persistent)
    if _on_any_rank(problem is not None):
        raise UserError(problem or "--save/--load: another rank cannot use its path (its error says why)")


def write_atomically(path: str, text: str) -> None:
    """Replace `path` with `text` so that a reader sees the old or the new content, never a part:
    a temporary file beside it, fsync, rename, fsync of the directory."""
    folder = os.path.dirname(path) or "."
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def save_checkpoint(root: str, model: list, optimizer, scheduler, iteration: int, consumed: int,
                    with_optimizer: bool = True, with_rng: bool = True) -> str:
    """Write `root/iter_XXXXXXX` on all ranks, mark it complete, then point the tracker file at it. Without
    `with_optimizer` (--no-save-optim) the optimizer state and schedule are left out, without `with_rng`
    (--no-save-rng) the random streams."""
    from megatron.core import dist_checkpointing

    from .step import sync_parameters

    sync_parameters(model)  # --overlap-param-gather: the last step's weights are still sharded
    path = iteration_dir(root, iteration)
    if torch.distributed.get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)  # a part written before a crash, or an older copy
        os.makedirs(path, exist_ok=True)
    torch.distributed.barrier()
    layout = checkpoint_format(model)
    state = _full_state(layout, optimizer, scheduler, iteration, consumed, with_optimizer=with_optimizer,
                        is_loading=False)
    dist_checkpointing.save(state, path)
    if with_rng:
        rng_state.save(path, layout.random_streams())
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        write_atomically(os.path.join(path, COMPLETE), f"{iteration}\n")
        write_atomically(os.path.join(root, TRACKER), str(iteration))
    torch.distributed.barrier()
    _say("saved checkpoint at iteration %d to %s", iteration, path)
    return path


def tracked_iteration(root: str) -> Optional[int]:
    """The tracker's iteration; None when it is missing, empty or not a number."""
    try:
        with open(os.path.join(root, TRACKER)) as tracker:
            return int(tracker.read().strip())
    except (OSError, ValueError):
        return None


def iterations_in(root: str) -> list[int]:
    """The iterations `root` has a directory of, complete or not, newest first."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    return sorted((int(m.group(1)) for m in map(_ITERATION_DIR.fullmatch, names) if m), reverse=True)


def complete_iterations(root: str) -> list[int]:
    """The iterations of `root` that every rank finished writing, newest first."""
    return [i for i in iterations_in(root) if os.path.isfile(os.path.join(iteration_dir(root, i), COMPLETE))]


def load_candidates(root: str) -> list[int]:
    """The iterations `--load` tries, in order: the newest complete ones and the tracker's."""
    tracked = tracked_iteration(root)
    return sorted(set(complete_iterations(root)) | ({tracked} if tracked is not None else set()), reverse=True)


def checkpoints_to_try(root: str, step: Optional[int] = None,
                       non_persistent: Optional[str] = None) -> list[tuple[str, int]]:
    """(folder, iteration) pairs `--load root` tries, in order: iteration `step` (from `root`, else from
    the non-persistent folder), or the newest first across both folders, the non-persistent one first
    where both hold an iteration (Megatron-LM loads it when it is at least as new)."""
    roots = [root] + ([non_persistent] if non_persistent else [])
    if step is not None:
        found = [(where, step) for where in roots if os.path.isdir(iteration_dir(where, step))]
        if not found:
            raise UserError(f"--load {root}: no checkpoint of iteration {step} "
                            f"({iteration_dir(root, step)} is missing)")
        return found[:1]
    pairs = [(where, i) for where in roots for i in load_candidates(where)]
    return sorted(pairs, key=lambda pair: (pair[1], pair[0] == non_persistent), reverse=True)


def load_checkpoint(root: str, model: list, optimizer, scheduler, weights_only: bool = False,
                    step: Optional[int] = None, with_optimizer: bool = True,
                    with_rng: bool = True, required: bool = False,
                    non_persistent: Optional[str] = None) -> Optional[Resumed]:
    """Load iteration `step` (default: the newest that loads) of `root` into this layout's model,
    optimizer and scheduler.

    None, with a warning, when `root` holds no checkpoint and no `step` is asked for: Megatron-LM then
    starts from random weights (a launch line with `--save DIR --load DIR` on a new DIR). Without
    `with_optimizer` (--no-load-optim) the weights and the iteration load, the optimizer state and
    the learning-rate schedule do not; without `with_rng` (--no-load-rng) the random streams keep
    their fresh seeds (Megatron-LM's checkpointing.load_checkpoint). `required` (--exit-on-missing-checkpoint):
    a `root` without a checkpoint is a UserError instead. `non_persistent`: the folder of global
    non-persistent checkpoints, whose iterations count as root's (checkpoints_to_try)."""
    candidates = checkpoints_to_try(root, step, non_persistent)
    if not candidates:
        if os.path.isfile(os.path.join(root, TRACKER)):  # a tracker that names no iteration, and nothing complete
            raise UserError(f"--load {root}: {TRACKER} names no iteration and no complete checkpoint is there")
        if required:
            raise UserError(f"--load {root}: no checkpoint there (--exit-on-missing-checkpoint)")
        if torch.distributed.get_rank() == 0:
            logger.warning("WARNING: could not find the metadata file %s; will not load any checkpoints and "
                           "will start from random", os.path.join(root, TRACKER))
        return None
    options = dict(weights_only=weights_only, with_optimizer=with_optimizer, with_rng=with_rng)
    reasons = []
    for where, iteration in candidates:
        loaded, layout, failure = _try_load(where, iteration, model, optimizer, scheduler, options)
        if failure is None:
            _say_fallback(root, iteration, reasons)
            return _finish_load(where, iteration, loaded, layout, optimizer, scheduler, options)
        reasons.append(f"iteration {iteration}{'' if where == root else f' of {where}'}: {failure}")
    raise UserError(f"--load {root}: no checkpoint there can be read ({'; '.join(reasons)})")


class NoOptimizerState(UserError):
    """A resume that asks for the optimizer state of an iteration saved without it: an older iteration is no
    substitute (it would silently undo the progress since), so the run stops with one line, as Megatron-LM's."""


def _try_load(root: str, iteration: int, model: list, optimizer, scheduler, options: dict):
    """Read iteration `iteration` into the model: (what was read, the format object that read it, None)
    when every rank read it, else (None, None, why not), the same answer on every rank."""
    failure, loaded, layout = None, None, None
    try:
        load_optimizer = options["with_optimizer"] and not options["weights_only"]
        path = iteration_dir(root, iteration)
        missing = [name for name in ("metadata.json", "common.pt") if not os.path.isfile(os.path.join(path, name))]
        if missing:
            raise FileNotFoundError(f"{' and '.join(missing)} missing in {path}")
        saved = read_saved_layout(path)
        if load_optimizer and saved.optimizer_kind is None:
            raise NoOptimizerState(f"--load {root}: iteration {iteration} was saved without optimizer state "
                                   "(--no-save-optim): resume it with --no-load-optim or --finetune")
        layout = checkpoint_format(model, optimizer, saved)
        loaded = {}
        for selection in layout.load_passes():
            layout.select(selection)
            _read_pass(path, layout, optimizer, scheduler, load_optimizer, loaded)
        layout.select(None)
        layout.load_model(loaded)
        _say_conversion(path, saved, layout)
    except (KeyboardInterrupt, SystemExit, NoOptimizerState):
        raise
    except BaseException as error:  # noqa: BLE001 - torch DCP's CheckpointException is a BaseException
        failure = describe_failure(error)
    if _on_any_rank(failure is not None):
        return None, None, failure or "another rank could not read it"
    return loaded, layout, None


def _read_pass(path: str, layout, optimizer, scheduler, load_optimizer: bool, loaded: dict) -> None:
    """Read what `layout` selects of iteration `path` into `loaded`; and then, where the checkpoint holds
    no fp32 masters for this run's 16-bit weights, its fp32 weights into them (a second read)."""
    from megatron.core import dist_checkpointing

    template = _full_state(layout, optimizer, scheduler, 0, 0, with_optimizer=load_optimizer, is_loading=True)
    _merge(loaded, dist_checkpointing.load(template, path, validate_access_integrity=layout.validates_access))
    masters = layout.model_space.masters_from_weights if load_optimizer and layout.model_space else {}
    if masters:
        _merge(loaded, dist_checkpointing.load({"optimizer": masters}, path,
                                               validate_access_integrity=layout.validates_access))


def _merge(target: dict, source: dict) -> None:
    """Add what one load pass read to what the earlier passes read (their modules are disjoint)."""
    for key, value in source.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


def _say_conversion(path: str, saved: SavedLayout, layout) -> None:
    """One line when the checkpoint was written by the other runtime, or with another optimizer structure."""
    runtimes = {STOCK_FORMAT: "megatron-space (stock runtime)", "hybrid": "hybrid-space"}
    if saved.format != layout.format:
        _say("%s: written by a %s run, read into this %s run under its stored keys", path,
             runtimes.get(saved.format, saved.format), runtimes.get(layout.format, layout.format))
    elif getattr(layout, "optimizer_mismatch", None):
        _say("%s: %s; its optimizer state is read per parameter", path, layout.optimizer_mismatch)


SCHEDULE_FIELDS = ("max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "lr_decay_style", "start_wd", "end_wd",
                   "wd_incr_steps", "wd_incr_style")
"""What megatron-core's OptimizerParamScheduler.load_state_dict checks against its own (steps count samples)."""


def _say_schedule_changes(scheduler, saved: dict) -> None:
    """One line when the command line's schedule differs from the checkpoint's, saying whose the run keeps
    (megatron-core's scheduler logs nothing that the user sees, and Megatron-LM, without either flag, stops)."""
    ours = scheduler.state_dict()
    changed = [f"{name} {saved[name]} -> {ours[name]}" for name in SCHEDULE_FIELDS
               if name in saved and saved[name] != ours[name]]
    if not changed:
        return
    kept = ("the command line's (--override-opt_param-scheduler)" if scheduler.override_opt_param_scheduler
            else "the checkpoint's (--override-opt_param-scheduler takes the command line's)")
    _say("the command line's learning-rate schedule differs from the checkpoint's (%s; steps in samples): the run "
         "keeps %s", ", ".join(changed), kept)


def _plain_rate_groups(optimizer, scheduler) -> list[int]:
    """Positions of the param groups that run at the schedule's own rates (not --decoupled-lr's), read before
    a load: megatron-core gives each group its `max_lr`/`min_lr`, which the scheduler prefers to its own."""
    return [position for position, group in enumerate(optimizer.param_groups)
            if (group.get("max_lr"), group.get("min_lr")) == (scheduler.max_lr, scheduler.min_lr)]


def _rates_to_groups(optimizer, scheduler, plain: list[int]) -> None:
    """Give those groups the rates the loaded scheduler settled on (the checkpoint's, or with
    --override-opt_param-scheduler the command line's), whichever state the optimizer load left in them (the
    checkpoint's groups, or this run's where the state was read per parameter), and reset the rates."""
    groups = optimizer.param_groups
    for position in plain:
        groups[position]["max_lr"], groups[position]["min_lr"] = scheduler.max_lr, scheduler.min_lr
    scheduler.step(increment=0)


def describe_failure(error: BaseException) -> str:
    """`Type: first line` of what reading a checkpoint raised; for torch DCP's CheckpointException,
    which wraps each rank's error, the first rank's."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        wrapped = next(iter(failures.values()))
        error = wrapped[0] if isinstance(wrapped, tuple) else wrapped
    text = str(error).strip().splitlines()[0][:160] if str(error).strip() else "unreadable"
    return f"{type(error).__name__}: {text}"


def _chunk_keys(model: list) -> list[str]:
    return ["model"] if len(model) == 1 else [f"model{i}" for i in range(len(model))]


def _on_any_rank(flag: bool) -> bool:
    """Whether `flag` holds on some rank (every rank must call it)."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    flag = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())


def _say(message: str, *values) -> None:
    """Log on rank 0 only (Megatron-LM's print_rank_0): one line per job, not per rank."""
    if torch.distributed.get_rank() == 0:
        logger.info(message, *values)


def _say_fallback(root: str, loaded: int, reasons: list[str]) -> None:
    if reasons and torch.distributed.get_rank() == 0:
        logger.warning("--load %s: damaged or incomplete checkpoint, fell back to iteration %d, the newest "
                       "that reads (%s)", root, loaded, "; ".join(reasons))


def _finish_load(root: str, iteration: int, loaded: dict, layout, optimizer, scheduler, options: dict) -> Resumed:
    """Optimizer, schedule and random streams of the iteration _try_load read."""
    path = iteration_dir(root, iteration)
    if options["weights_only"]:
        optimizer.reload_model_params()
        _say("loaded weights of iteration %d from %s", iteration, path)
        return Resumed(iteration=0, consumed_samples=0)
    if not options["with_optimizer"]:
        optimizer.reload_model_params()
        _say("resumed weights of iteration %d of %s (--no-load-optim: fresh optimizer state and "
             "learning-rate schedule)", loaded["iteration"], path)
    else:
        plain = _plain_rate_groups(optimizer, scheduler)
        layout.load_optimizer(optimizer, loaded["optimizer"])
        _say_schedule_changes(scheduler, loaded["opt_param_scheduler"])
        scheduler.load_state_dict(loaded["opt_param_scheduler"])
        _rates_to_groups(optimizer, scheduler, plain)
        _say("resumed from iteration %d of %s", loaded["iteration"], path)
    if options["with_rng"] and not rng_state.load(path, layout.random_streams()) and torch.distributed.get_rank() == 0:
        logger.info("--load %s: no random-stream state for this rank, world size and plan; dropout and other "
                    "random draws start from fresh seeds", path)
    return Resumed(iteration=int(loaded["iteration"]), consumed_samples=int(loaded["consumed_samples"]))
