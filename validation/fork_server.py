"""Fork server for validation/launcher.py: one process imports torch, megatron-core (with patches/) and
the runtime once, then forks every rank the tests launch from that warm state.

A rank process otherwise spends about 2.5 s of CPU importing them (`python -X importtime -c "import
patches"`), and the suite starts some hundreds of ranks on a 2-core machine. Each forked rank starts a
session of its own, takes the environment, working directory and argv it was sent, sends stdout and
stderr to its log and runs the script as `__main__`, as `python SCRIPT ARGS...` would. Nothing in the
preloaded modules reads the environment at import (the runtime reads RANK, MASTER_PORT, fault and OOM
injections when it runs), and the server imports them with OMP_NUM_THREADS=1, as every rank sets it.
Unlike fresh processes, forked ranks share the server's string-hash seed and numpy's unseeded state, and
the first entry of their import path is the repository (the server runs as `python -m
validation.fork_server` from it), not the script's folder: the scripts run here import what they share by
package (`tests.runtime.worker_stats`, `megatron_auto`), which works from either, as the repository is on
every rank's PYTHONPATH. tests/runtime/test_launcher.py checks they otherwise run a script as `python` does.

Two more things are done once here rather than in every rank (both CPU only; what a rank computes is the same):
- torch.compile's machinery (torch._dynamo, torch._inductor.compile_fx and the inductor backend's lookup) is
  imported too. patches/deferred_compile.py leaves it unimported until a fused function first runs, and every
  rank of a MoE run calls one (the router's expert-bias update is @jit_fuser): each such rank paid about 1.6 s
  of CPU importing it. What those modules read from the environment at import is torch's own compile
  settings (TORCHINDUCTOR_*, TORCHDYNAMO_*, TORCH_COMPILE_*), which no test sets for its ranks: the server's
  environment and a rank's agree on them.
- gc.freeze() after the imports: the ~270,000 objects they made move to the permanent generation, so the
  collections a rank runs (destroy_parallel_groups collects after every layout; the interpreter's own full
  collections) no longer walk them, nor write to their pages, which would copy them into every rank
  (measured: 0.137 s of CPU per gc.collect() before, under 1 ms after). Nothing they hold is garbage a rank
  could free: the server keeps them alive anyway.

Protocol, one Unix-socket connection per rank: the client sends one JSON line {argv (a script and its arguments,
or "-m", a module and its arguments), env, cwd, log, and
optionally stderr, a file of its own for fd 2};
the server answers the rank's pid, then its exit code (negative: killed by that signal) when it ends.

    python -m validation.fork_server SOCKET_PATH     # started by launcher.py, never by hand
"""
from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import traceback



PRELOADED = ("patches",  # torch and megatron-core, patched
             "megatron_auto.runtime.checkpoint", "megatron_auto.runtime.data", "megatron_auto.runtime.distributed",
             "megatron_auto.runtime.fit", "megatron_auto.runtime.model", "megatron_auto.runtime.session",
             "megatron_auto.runtime.step", "megatron_auto.runtime.hybrid.hybrid_runtime",
             "megatron_auto.train.pretrain")  # what tools/pretrain_gpt.py runs: its flags, the planner


COMPILER = ("torch._dynamo", "torch._inductor.compile_fx")
"""What a rank's first compiled call imports (module docstring), with the backend lookup in _import_compiler."""


def preload() -> None:
    """Import PRELOADED (the launcher starts the server with the repository on PYTHONPATH, as its ranks)."""
    for name in PRELOADED:
        importlib.import_module(name)
    _import_compiler()
    gc.freeze()


def _import_compiler() -> None:
    for name in COMPILER:
        importlib.import_module(name)
    from torch._dynamo.eval_frame import get_compiler_fn

    get_compiler_fn("inductor")  # imports the inductor backend's modules; compiles nothing


def _exit_code(error: SystemExit) -> int:
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    print(error.code, file=sys.stderr)  # what the interpreter does with sys.exit("message")
    return 1


def run_rank(request: dict) -> None:
    """In the forked child: become `python ARGV...` in its own session; never returns."""
    os.setsid()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    for fd, path in ((1, request["log"]), (2, request.get("stderr") or request["log"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, fd)
        os.close(out)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    code = 0
    try:
        _run_main(list(request["argv"]))
    except SystemExit as error:
        code = _exit_code(error)
    except BaseException:  # noqa: BLE001  (the interpreter prints any uncaught error and exits 1)
        traceback.print_exc()
        code = 1
    try:  # the interpreter's own shutdown order: join non-daemon threads, then atexit handlers
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _run_main(argv: list[str]) -> None:
    """Run `python ARGV...`'s main: a script's path, or `-m MODULE` (runpy puts the module's file in argv[0],
    as the interpreter does)."""
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")


def _read_request(conn: socket.socket) -> dict:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("client closed before its request ended")
        data += chunk
    return json.loads(data)


def _fork_rank(listener: socket.socket, conn: socket.socket, waiting: dict[int, socket.socket]) -> int:
    request = _read_request(conn)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the rank holds none of the server's sockets
        for sock in (listener, conn, *waiting.values()):
            sock.close()
        run_rank(request)
    conn.sendall(f"{pid}\n".encode())
    return pid


def _reap(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass  # the client gave up on this rank
            conn.close()


def serve(socket_path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    parent, waiting = os.getppid(), {}
    print("ready", flush=True)
    while os.getppid() == parent:  # the test session that started this server still runs
        ready, _, _ = select.select([listener], [], [], 0.05)
        if ready:
            conn, _ = listener.accept()
            try:
                waiting[_fork_rank(listener, conn, waiting)] = conn
            except (OSError, ValueError) as error:
                print(f"fork server: bad request: {error}", file=sys.stderr, flush=True)
                conn.close()
        _reap(waiting)


if __name__ == "__main__":
    preload()
    serve(sys.argv[1])
