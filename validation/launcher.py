"""Start N ranks of a script on this machine the way torchrun does (RANK, WORLD_SIZE, MASTER_*), with a hard timeout:
the multi-rank tests (tests/runtime) and the validation harnesses launch through it.

Ranks are forked from fork_server.py, which has torch and megatron-core imported already; with
MEGATRON_AUTO_TEST_SPAWN=1 each rank is a fresh `python SCRIPT ARGS...` process instead.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Optional, Union

REPO = Path(__file__).resolve().parents[1]
SPAWN_ENV = "MEGATRON_AUTO_TEST_SPAWN"


@dataclass(frozen=True)
class LaunchResult:
    returncodes: tuple[int, ...]
    output: str
    """stdout+stderr of all ranks, rank by rank."""
    seconds: float

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.returncodes)


PORTS_PER_WORKER, FIRST_PORT = 2000, 20000  # four workers' blocks end at 28000: clear of 29400/29500 defaults


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range starts here


def _port_candidates():
    """This process's ports: a block per pytest-xdist worker below the ephemeral range, walked from a
    pid-dependent start so that two test sessions on one machine rarely meet; where the kernel's
    ephemeral range reaches that low there is no quiet block, and the kernel picks."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").lstrip("gw") or 0)
    first = FIRST_PORT + PORTS_PER_WORKER * (worker % 4)
    offset = os.getpid() * 7919
    while True:
        offset += 1
        yield first + offset % PORTS_PER_WORKER if _ephemeral_floor() > FIRST_PORT + 4 * PORTS_PER_WORKER else 0


_PORTS = _port_candidates()


def free_port() -> int:
    """A port for a job's MASTER_PORT that nothing else takes before rank 0 listens on it.

    A port from bind(port 0) lies in the kernel's ephemeral range, where every connect() and every gloo
    pair of the other pytest worker draw theirs; one drawn there in the seconds before rank 0 bound it left
    the ranks connecting to a port no store listened on (CI, 8 ranks: "timed out ... trying to connect").
    Ports below that range are only ever taken by an explicit bind."""
    for port in _PORTS:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]


NodeSizes = Union[int, Sequence[int], None]
"""Ranks per node: one number for every node, one per node in node-rank order (torchrun agents of different
--nproc-per-node), or None for all on one node."""


def rank_env(rank: int, world_size: int, port: int, local_world_size: NodeSizes = None) -> dict[str, str]:
    """torchrun's variables for `rank`; `local_world_size`: ranks per node (NodeSizes). torchrun numbers the
    ranks node by node, so a rank's node is the one whose ranks it falls in."""
    env = dict(os.environ)
    sizes = local_world_size if isinstance(local_world_size, Sequence) else \
        [local_world_size or world_size] * (world_size // (local_world_size or world_size))
    assert sum(sizes) == world_size, f"nodes of {list(sizes)} ranks hold no world of {world_size}"
    first = 0
    for node, per_node in enumerate(sizes):
        if rank < first + per_node:
            break
        first += per_node
    env.update(RANK=str(rank), LOCAL_RANK=str(rank - first), GROUP_RANK=str(node), WORLD_SIZE=str(world_size),
               LOCAL_WORLD_SIZE=str(per_node),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
               PYTHONWARNINGS="ignore")
    return env


class ForkedRank:
    """A rank forked by the fork server, with the part of subprocess.Popen's interface launch() uses."""

    def __init__(self, connection: socket.socket):
        self._connection, self._buffer, self.returncode = connection, b"", None
        self.pid = int(self._line(None))

    def _line(self, timeout: Optional[float]) -> Optional[str]:
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._connection], [], [], timeout)
            if not ready:
                return None
            chunk = self._connection.recv(64)
            if not chunk:
                raise ConnectionError("the fork server closed the connection")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            line = self._line(timeout)
            if line is None:
                raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout)
            self.returncode = int(line)
            self._connection.close()
        return self.returncode

    def poll(self) -> Optional[int]:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None


class ForkServer:
    """validation/fork_server.py, started on first use and stopped when the test session ends."""

    def __init__(self):
        self.socket_path = os.path.join(tempfile.mkdtemp(prefix="megatron-auto-forks-"), "server.sock")
        env = rank_env(0, 1, 0)
        for name in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                     "MASTER_PORT"):
            del env[name]
        self.process = subprocess.Popen([sys.executable, "-m", "validation.fork_server", self.socket_path], env=env,
                                        cwd=REPO, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        ready = self.process.stdout.readline()
        if ready != b"ready\n":
            raise RuntimeError(f"fork server did not start (exit {self.process.wait()})")
        atexit.register(self.stop)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def fork(self, argv: list[str], env: dict[str, str], log_path: Path,
             stderr_path: Optional[Path] = None) -> ForkedRank:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(self.socket_path)
        request = {"argv": argv, "env": env, "cwd": str(REPO), "log": str(log_path),
                   "stderr": str(stderr_path) if stderr_path else None}
        connection.sendall(json.dumps(request).encode() + b"\n")
        return ForkedRank(connection)


_server: Optional[ForkServer] = None


def _fork_server() -> Optional[ForkServer]:
    """The session's fork server, or None when ranks are to be spawned fresh."""
    global _server
    if os.environ.get(SPAWN_ENV) == "1" or not hasattr(os, "fork"):
        return None
    if _server is None or _server.process.poll() is not None:
        _server = ForkServer()
    return _server


def _start_rank(rank: int, world_size: int, port: int, argv: list[str], log_path: Path,
                local_world_size: NodeSizes = None):
    """One rank of `python argv...`: forked from the server when the script is a path, spawned otherwise."""
    env = rank_env(rank, world_size, port, local_world_size)
    server = _fork_server() if argv[0].endswith(".py") else None
    if server is not None:
        return server.fork(argv, env, log_path)
    with log_path.open("w") as log:
        return subprocess.Popen([sys.executable, *argv], env=env, cwd=REPO,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def run_script(argv: list[str], env: dict[str, str], timeout_s: float,
               fresh: bool = False) -> subprocess.CompletedProcess:
    """`python argv...` (a script and its arguments, or "-m", a module and its arguments) as
    subprocess.run(..., cwd=REPO, capture_output=True, text=True, timeout=timeout_s) gives it, the process
    forked from the fork server (spawned with MEGATRON_AUTO_TEST_SPAWN=1). A forked
    script ends without the interpreter's shutdown (module teardown, finalizers), so tests of everything a
    run prints, a "one line and nothing more" refusal say, ask for a `fresh` interpreter."""
    server = None if fresh else _fork_server()
    if server is None:
        return subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    with tempfile.TemporaryDirectory(prefix="megatron-auto-run-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        rank = server.fork(argv, env, out, err)
        try:
            code = rank.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(rank.pid, signal.SIGKILL)
            rank.wait()
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout_s) from None
        return subprocess.CompletedProcess([sys.executable, *argv], code, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))


def _wait_failing_fast(procs: list, deadline: float, fail_fast_s: float) -> float:
    """Wait for every rank until `deadline`, or until `fail_fast_s` after the first rank that exits with an error
    (its peers may wait in a collective for it forever); returns the deadline that held."""
    codes = [proc.poll() for proc in procs]
    while None in codes and time.perf_counter() < deadline:
        if any(code not in (None, 0) for code in codes):
            deadline = min(deadline, time.perf_counter() + fail_fast_s)
        time.sleep(0.2)
        codes = [proc.poll() for proc in procs]
    return deadline


def launch(world_size: int, argv: list[str], timeout_s: float, log_dir: Path,
           local_world_size: NodeSizes = None, fail_fast_s: Optional[float] = None) -> LaunchResult:
    """Run `python argv...` on `world_size` ranks (in nodes of `local_world_size` ranks, torchrun's LOCAL_WORLD_SIZE:
    NodeSizes); kill every rank if any exceeds `timeout_s`, or, with `fail_fast_s`, when they still run that
    long after one rank failed."""
    port, start = free_port(), time.perf_counter()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_paths = [log_dir / f"rank{r}.log" for r in range(world_size)]
    for path in log_paths:
        path.write_text("")
    procs = [_start_rank(r, world_size, port, argv, log_paths[r], local_world_size) for r in range(world_size)]
    deadline = start + timeout_s
    try:
        if fail_fast_s is not None:
            deadline = _wait_failing_fast(procs, deadline, fail_fast_s)
        for proc in procs:
            proc.wait(timeout=max(0.1, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    output = [f"===== rank {rank} (exit {proc.returncode}) =====\n{log_paths[rank].read_text(errors='replace')}"
              for rank, proc in enumerate(procs)]
    return LaunchResult(tuple(p.returncode for p in procs), "\n".join(output), time.perf_counter() - start)


def run_cases(tmp: Path, world_size: int, worker: str, cases: list[dict], timeout_s: float) -> dict:
    """Launch `worker` (a script under tests/runtime) on `world_size` ranks with `cases` as JSON;
    returns the results it writes. Fails the test, with the ranks' output, if the launch fails."""
    spec, out = tmp / f"cases{world_size}.json", tmp / f"results{world_size}.json"
    spec.write_text(json.dumps(cases))
    result = launch(world_size, [f"tests/runtime/{worker}", str(spec), str(out)], timeout_s, tmp / f"logs{world_size}")
    assert result.ok, f"{world_size}-rank launch failed after {result.seconds:.0f}s:\n{result.output[-6000:]}"
    return json.loads(out.read_text())
