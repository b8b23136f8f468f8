"""`python -m torch.distributed.run ARGS...` for the elastic test of test_checkpoint_safety.py, with one change:
the port the agents publish for their workers' MASTER_PORT comes from validation.launcher.free_port (below the
kernel's ephemeral range) instead of torch's get_free_port (a bind to port 0, inside it).

With the rendezvous store not shared (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, which that test needs), rank 0's
TCPStore binds the published port only after its interpreter has started, seconds later; in those seconds the
other pytest worker's gloo pairs draw ephemeral ports by the thousand, and one took it on a fresh clone
(2026-11-29: "EADDRINUSE", the attempt failed and torchrun's restart changed the course of the test). Nothing
else of torchrun changes.

    python tests/runtime/quiet_port_torchrun.py --nnodes 1:2 ... tools/pretrain_gpt.py ...
"""
import sys

from torch.distributed import run
from torch.distributed.elastic.rendezvous import api

from validation.launcher import free_port

if __name__ == "__main__":
    api.get_free_port = free_port  # RendezvousStoreInfo.build's fallback when the store is not shared
    sys.exit(run.main())
