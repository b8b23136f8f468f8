"""timing.block_seconds: what a block counts."""
import time

from megatron_auto.profiling.timing import block_seconds


def test_block_leaves_out_the_untimed_call_before_each_run():
    # Each timed call sleeps 1 ms after an untimed 200 ms one: the block must report at least the
    # 1 ms (sleep never returns early) and far less than the untimed 200 ms it left out.
    seconds = block_seconds(lambda: time.sleep(0.001), iters=2, warmup=0, repeats=1,
                            untimed=lambda: time.sleep(0.2))
    assert 0.001 <= seconds < 0.1


def test_block_counts_every_call_and_the_closing_barrier_wait():
    waits = []
    seconds = block_seconds(lambda: time.sleep(0.002), iters=3, warmup=0, repeats=1,
                            barrier=lambda: waits.append(time.sleep(0.03)))
    # The closing barrier's 30 ms is spread over the 3 calls: 2 ms + 10 ms each at least.
    assert seconds >= 0.012 and len(waits) == 2
