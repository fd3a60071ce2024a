import subprocess
import sys

import pytest

from sglang_hydra.utils.envflags import EnvValueError, env_flag, env_float, env_int
from sglang_hydra.utils.ports import free_port, port_is_free
from sglang_hydra.utils.procs import stop_process, stop_processes


@pytest.mark.parametrize("raw,expected", [("1", True), ("on", True), ("YES", True), ("true", True),
                                          ("0", False), ("Off", False), ("no", False), ("", False)])
def test_env_flag_spellings(raw, expected):
    assert env_flag("X", environ={"X": raw}) is expected


def test_env_flag_rejects_junk_naming_the_variable():
    with pytest.raises(EnvValueError, match="MY_FLAG='maybe'"):
        env_flag("MY_FLAG", environ={"MY_FLAG": "maybe"})


def test_env_numbers():
    assert env_float("T", 1.5, environ={}) == 1.5
    assert env_int("N", 3, environ={"N": " 7 "}) == 7
    with pytest.raises(EnvValueError, match="an integer"):
        env_int("N", 3, environ={"N": "7.5"})


def test_free_port_is_bindable():
    port = free_port()
    assert port_is_free(port)


def test_stop_process_kills_a_child_that_ignores_sigterm():
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"up"
    stop_process(p, grace_s=0.2)
    assert p.returncode == -9


def test_stop_processes_many():
    ps = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    stop_processes(ps, grace_s=2.0)
    assert all(p.returncode is not None for p in ps)
