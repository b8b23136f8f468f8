"""Patch: the torch_dist save collects its writers' results in a queue of the saving process, not a Manager's.

Why: `FileSystemWriterAsync` (strategies/filesystem_async.py) takes its results queue from
`_get_write_results_queue`, which starts a `multiprocessing` Manager process per rank, with the
"spawn" start method, on the rank's first save. The spawned process imports the rank's main script
(`__mp_main__`), and so torch and megatron-core: about 2 s of CPU per saving rank process (measured with
torch 2.13, Python 3.11), and it stays alive, with its threads, until the rank ends. The queue only
carries results between processes for an asynchronous save; a synchronous save (`dist_checkpointing.save`
without `async_sharded_save`, the only kind this runtime makes: checkpoint.save_checkpoint) puts and gets
them in the saving process itself (`AsyncRequest.execute_sync` runs `write_preloaded_data_multiproc` there,
then `retrieve_write_results` reads the queue), where a `queue.Queue` carries the same results.
Targets: megatron-core 0.16.1.
Removable when: megatron-core makes its results queue only for asynchronous saves.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

import importlib

from ._checks import require_version
from ._source import Replacement, patched_source, rewrite_function

NAME = "dist_checkpointing_results_queue"
TARGET_VERSIONS = ("0.16.1",)
FUNCTION = "_get_write_results_queue"
REPLACEMENTS = (
    Replacement("""        ctx = mp.get_context("spawn")
        _results_queue = ctx.Manager().Queue()""", """        _results_queue = queue.Queue()"""),
)


def _filesystem_async():
    return importlib.import_module("megatron.core.dist_checkpointing.strategies.filesystem_async")


def check() -> None:
    """Raise PatchTargetChanged unless the queue is still made as expected."""
    require_version(NAME, TARGET_VERSIONS)
    patched_source(_filesystem_async(), FUNCTION, REPLACEMENTS)


def apply() -> None:
    check()
    rewrite_function(_filesystem_async(), FUNCTION, REPLACEMENTS)


def is_applied() -> bool:
    return getattr(getattr(_filesystem_async(), FUNCTION), "__megatron_auto_patched__", False)
