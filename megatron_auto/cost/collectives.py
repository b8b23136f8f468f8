"""Ring collectives and point-to-point transfers over one tier of links.

Volumes per rank from shared/reference/hardware.md (NCCL's ring algorithm):
all-reduce moves 2(n-1)/n x bytes through each rank's link, all-gather and
reduce-scatter (n-1)/n x bytes each. Latency: one hop per ring step.
"""
from __future__ import annotations

from ..specs.cluster import LinkSpec


def all_reduce_time(bytes_: float, group_size: int, link: LinkSpec) -> float:
    """Seconds for a ring all-reduce of `bytes_` (the full buffer) over `group_size` ranks."""
    if group_size <= 1 or bytes_ <= 0:
        return 0.0
    steps = 2 * (group_size - 1)
    return steps / group_size * bytes_ / link.effective_bandwidth + steps * link.latency_s


def all_gather_time(bytes_: float, group_size: int, link: LinkSpec) -> float:
    """Seconds to all-gather a buffer whose gathered size is `bytes_`."""
    if group_size <= 1 or bytes_ <= 0:
        return 0.0
    steps = group_size - 1
    return steps / group_size * bytes_ / link.effective_bandwidth + steps * link.latency_s


def reduce_scatter_time(bytes_: float, group_size: int, link: LinkSpec) -> float:
    """Seconds to reduce-scatter a buffer of `bytes_` (before scattering); same volume as all-gather."""
    return all_gather_time(bytes_, group_size, link)


def all_to_all_time(bytes_: float, group_size: int, link: LinkSpec) -> float:
    """Seconds for an all-to-all in which each rank holds `bytes_` and keeps 1/n of it: (n-1)/n x bytes
    cross each rank's link each way (NCCL runs it as grouped ncclSend/ncclRecv pairs, all at once on
    full-duplex links: NCCL docs, "Point-to-point communication", all-to-all), with one latency."""
    if group_size <= 1 or bytes_ <= 0:
        return 0.0
    return (group_size - 1) / group_size * bytes_ / link.effective_bandwidth + link.latency_s


def p2p_time(bytes_: float, link: LinkSpec) -> float:
    """Seconds to send `bytes_` from one rank to one other."""
    if bytes_ <= 0:
        return 0.0
    return bytes_ / link.effective_bandwidth + link.latency_s
