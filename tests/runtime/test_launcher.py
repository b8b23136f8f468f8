"""The test launcher's forked ranks behave as `python SCRIPT ARGS...` processes do: the same argv,
environment, working directory, output and exit status, whether forked from fork_server.py or spawned
(one difference, by design: a forked script's folder is not first on its import path; fork_server's docstring)."""
from __future__ import annotations

import subprocess

import pytest

from validation import launcher

SCRIPT = """
import os, sys, threading, time
print("argv", sys.argv[1:], "rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "cwd", os.getcwd())
import validation.launcher  # the repository's packages import by name, forked or spawned (fork_server's docstring)
print("main", __name__, "imports", validation.launcher.__name__)
sys.stderr.write("to stderr\\n")
mode = sys.argv[1]
if mode == "thread":  # a non-daemon thread is joined before the process ends, as at interpreter exit
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread done", flush=True))).start()
elif mode == "message":
    sys.exit("stopped with a message")
elif mode == "raise":
    raise ValueError("uncaught")
elif mode == "hang":
    time.sleep(60)
elif mode != "ok":
    sys.exit(int(mode))
"""


@pytest.fixture(params=["fork", "spawn"])
def mode(request, monkeypatch):
    monkeypatch.setenv(launcher.SPAWN_ENV, "1" if request.param == "spawn" else "0")
    return request.param


@pytest.mark.parametrize("argument, codes, words", [
    ("ok", (0, 0), ["argv ['ok'] rank 0 of 2", "argv ['ok'] rank 1 of 2", "main __main__ imports validation.launcher",
                    "to stderr"]),
    ("3", (3, 3), ["rank 1 of 2"]),
    ("message", (1, 1), ["stopped with a message"]),
    ("raise", (1, 1), ["ValueError: uncaught", "Traceback"]),
    ("thread", (0, 0), ["thread done"]),
])
def test_ranks_run_the_script_as_a_process_would(tmp_path, mode, argument, codes, words):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    result = launcher.launch(2, [str(script), argument], 60, tmp_path / "logs")
    assert result.returncodes == codes, result.output
    assert f"cwd {launcher.REPO}" in result.output
    for word in words:
        assert word in result.output, result.output


def test_a_rank_past_the_timeout_is_killed(tmp_path, mode):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    result = launcher.launch(1, [str(script), "hang"], 2, tmp_path / "logs")
    assert result.returncodes == (-9,) and result.seconds < 30, result.output


@pytest.mark.parametrize("argument, code", [("ok", 0), ("message", 1), ("raise", 1), ("3", 3)])
def test_a_run_script_captures_stdout_and_stderr_apart(tmp_path, mode, argument, code):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    done = launcher.run_script([str(script), argument], launcher.rank_env(0, 1, 0), 60)
    assert done.returncode == code, done
    assert "argv" in done.stdout and "to stderr" not in done.stdout and "to stderr" in done.stderr


def test_a_run_script_runs_a_module_as_python_dash_m_does(tmp_path, mode):
    (tmp_path / "in.json").write_text('{"b": 1, "a": [2]}')
    done = launcher.run_script(["-m", "json.tool", "--sort-keys", str(tmp_path / "in.json")],
                               launcher.rank_env(0, 1, 0), 60)
    assert done.returncode == 0 and done.stdout == '{\n    "a": [\n        2\n    ],\n    "b": 1\n}\n', done
    refused = launcher.run_script(["-m", "json.tool", str(tmp_path / "absent.json")], launcher.rank_env(0, 1, 0), 60)
    assert refused.returncode != 0 and "absent.json" in refused.stderr, refused


def test_a_run_script_past_its_timeout_raises_as_subprocess_run_does(tmp_path, mode):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    with pytest.raises(subprocess.TimeoutExpired):
        launcher.run_script([str(script), "hang"], launcher.rank_env(0, 1, 0), 2)


def test_master_ports_come_from_outside_the_kernels_ephemeral_range():
    """The ports connect() and bind(0) hand out (gloo's pairs, the other worker's stores) never collide
    with a launch's MASTER_PORT; a port picked twice in a row is never the same."""
    floor, ceiling = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    ports = [launcher.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert not any(floor <= port <= ceiling for port in ports), ports
