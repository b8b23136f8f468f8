"""Start N ranks of a script the way torchrun does (RANK, WORLD_SIZE, MASTER_*), with a hard timeout."""
from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_pretrain_gpt(module_name: str = "pretrain_gpt"):
    """tools/pretrain_gpt.py imported as `module_name` (a test that patches its globals takes its own copy)."""
    spec = importlib.util.spec_from_file_location(module_name, REPO / "tools" / "pretrain_gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class LaunchResult:
    returncodes: tuple[int, ...]
    output: str
    """stdout+stderr of all ranks, rank by rank."""
    seconds: float

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.returncodes)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
               PYTHONWARNINGS="ignore")
    return env


def launch(world_size: int, argv: list[str], timeout_s: float, log_dir: Path) -> LaunchResult:
    """Run `python argv...` on `world_size` ranks; kill every rank if any exceeds `timeout_s`."""
    port, start = free_port(), time.perf_counter()
    log_dir.mkdir(parents=True, exist_ok=True)
    logs = [open(log_dir / f"rank{r}.log", "w+") for r in range(world_size)]
    procs = [subprocess.Popen([sys.executable, *argv], env=rank_env(r, world_size, port), cwd=REPO,
                              stdout=logs[r], stderr=subprocess.STDOUT, start_new_session=True)
             for r in range(world_size)]
    deadline = start + timeout_s
    try:
        for proc in procs:
            proc.wait(timeout=max(0.1, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    output = []
    for rank, log in enumerate(logs):
        log.seek(0)
        output.append(f"===== rank {rank} (exit {procs[rank].returncode}) =====\n{log.read()}")
        log.close()
    return LaunchResult(tuple(p.returncode for p in procs), "\n".join(output), time.perf_counter() - start)


def run_cases(tmp: Path, world_size: int, worker: str, cases: list[dict], timeout_s: float) -> dict:
    """Launch `worker` (a script under tests/runtime) on `world_size` ranks with `cases` as JSON;
    returns the results it writes. Fails the test, with the ranks' output, if the launch fails."""
    import json

    spec, out = tmp / f"cases{world_size}.json", tmp / f"results{world_size}.json"
    spec.write_text(json.dumps(cases))
    result = launch(world_size, [f"tests/runtime/{worker}", str(spec), str(out)], timeout_s, tmp / f"logs{world_size}")
    assert result.ok, f"{world_size}-rank launch failed after {result.seconds:.0f}s:\n{result.output[-6000:]}"
    return json.loads(out.read_text())
