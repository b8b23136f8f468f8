"""Injected rank failures, for the fault tests (tests/runtime/test_checkpoint_safety.py).

MEGATRON_AUTO_INJECT_KILL=ITERATION:RANK kills that rank with SIGKILL right after it
finishes iteration ITERATION (and the checkpoint save due then), in a job's first attempt
only (torchrun's TORCHELASTIC_RESTART_COUNT 0 or unset), so a job restarted by
`torchrun --max-restarts N` runs through.

MEGATRON_AUTO_INJECT_STALL=ITERATION:RANK:SECONDS makes that rank sleep for SECONDS at the
same point, as a hung data loader or file system would: its peers wait in their next
collective until --distributed-timeout-minutes runs out.

Unset, nothing happens.
"""
from __future__ import annotations

import os
import signal
import time

import torch

ENV = "MEGATRON_AUTO_INJECT_KILL"
STALL_ENV = "MEGATRON_AUTO_INJECT_STALL"


def maybe_inject(iteration: int) -> None:
    """Kill or stall this rank after `iteration` when the environment asks for it (first attempt only)."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    kill, stall = os.environ.get(ENV), os.environ.get(STALL_ENV)
    rank = torch.distributed.get_rank()
    if kill and [iteration, rank] == [int(part) for part in kill.split(":")]:
        os.kill(os.getpid(), signal.SIGKILL)
    if stall:
        at, stalled_rank, seconds = stall.split(":")
        if [iteration, rank] == [int(at), int(stalled_rank)]:
            time.sleep(float(seconds))


# What torch's gloo transport says when a peer is gone or silent (torch 2.x, gloo/transport/tcp).
_PEER_SIGNS = {
    "Timed out waiting": "timed out waiting for a peer (--distributed-timeout-minutes): a rank stalled or died",
    "Connection closed by peer": "lost the connection to a peer: a rank died or stopped",
    "Connection reset by peer": "lost the connection to a peer: a rank died or stopped",
    "Broken pipe": "lost the connection to a peer: a rank died or stopped",
}


def peer_failure(error: BaseException) -> str | None:
    """One line for an error that says another rank stalled or died (None for any other error).

    torch raises these as DistError or, from gloo's transport, as a plain RuntimeError; only
    the message tells them apart. With NCCL the watchdog ends the process itself.
    """
    import torch.distributed as dist

    if not isinstance(error, RuntimeError):
        return None
    text = str(error).strip()
    sign = next((meaning for key, meaning in _PEER_SIGNS.items() if key in text), None)
    if sign is None and not isinstance(error, dist.DistError):
        return None
    rank = os.environ.get("RANK", "?")  # the process group is already torn down here
    detail = text.splitlines()[0] if text else type(error).__name__
    detail = detail.split("] ", 1)[-1].split(". ", 1)[0][:160]  # gloo's first sentence, without [file:line]
    return f"rank {rank}: {sign or 'a collective failed'} ({detail}); the other ranks' logs say which"
