"""Hostile programs under the machine's strongest isolation: each gets the right verdict and
leaves the host untouched (checked from the host side, not from what the program printed)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

import pytest

from hybridflow.sandbox.executor import FINISHED, OUTPUT_LIMIT, TIME_LIMIT, run_code
from hybridflow.sandbox.isolation import detect_isolation
from hybridflow.sandbox.limits import SandboxLimits

ISOLATION = detect_isolation()
needs_bwrap = pytest.mark.skipif(not ISOLATION.strong, reason=f"needs bubblewrap: {ISOLATION.detail}")
LIMITS = SandboxLimits(wall_s=5, memory_mb=512, max_processes=16, max_output_bytes=4096)


def run(code: str, limits: SandboxLimits = LIMITS, **kwargs):
    return asyncio.run(run_code(code, limits=limits, isolation=ISOLATION, **kwargs))


def processes_with(text: str) -> list[int]:
    """Host processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_an_ordinary_program_passes_with_its_stdin():
    result = run("import sys\nname = sys.stdin.readline().strip()\nprint(f'hello {name}')", stdin="sandbox\n")
    assert result.status == FINISHED and result.return_code == 0 and result.passed
    assert result.stdout == "hello sandbox\n" and result.stderr == ""
    assert result.isolation == ISOLATION.level


def test_a_failing_program_fails_with_its_traceback():
    result = run("def f():\n    raise ValueError('wrong')\nf()")
    assert result.status == FINISHED and result.return_code == 1 and not result.passed
    assert "ValueError: wrong" in result.stderr and 'main.py", line 2' in result.stderr


@needs_bwrap
def test_writing_outside_the_work_dir_fails_and_the_host_is_untouched(tmp_path):
    target = tmp_path / "pwned.txt"
    code = (
        "import os\nopen('inside.txt', 'w').write('ok')\nprint(os.path.exists('inside.txt'))\n"
        f"for path in [{str(target)!r}, '/usr/pwned.txt', '/pwned.txt', os.path.expanduser('~/../pwned.txt')]:\n"
        "    try:\n        open(path, 'w').write('x')\n        print('WROTE', path)\n"
        "    except OSError as exc:\n        print('refused', type(exc).__name__)\n"
    )
    result = run(code)
    assert result.passed and "WROTE" not in result.stdout and result.stdout.startswith("True\n")
    assert not target.exists() and not Path("/usr/pwned.txt").exists() and not Path("/pwned.txt").exists()


@needs_bwrap
def test_secrets_of_the_host_cannot_be_read(tmp_path, monkeypatch):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    monkeypatch.setenv("HYBRIDFLOW_CANARY", "TOP-SECRET")
    home = os.path.expanduser("~")
    code = (
        "import os\n"
        f"for path in ['/etc/shadow', '/etc/passwd', {str(secret)!r}, {home!r} + '/.bashrc', '/proc/1/environ']:\n"
        "    try:\n        print('READ', path, open(path).read()[:20])\n"
        "    except OSError as exc:\n        print('refused', path, type(exc).__name__)\n"
        f"print('listing', os.path.isdir({home!r}) and os.listdir({home!r}))\n"
        "print('env', sorted(os.environ))\n"
    )
    result = run(code)
    assert result.passed, result.stderr
    assert "READ" not in result.stdout and "TOP-SECRET" not in result.stdout
    assert "HYBRIDFLOW_CANARY" not in result.stdout


@needs_bwrap
def test_no_network_not_even_loopback(listener):
    port, server = listener
    code = (
        "import socket\n"
        f"for host in ['127.0.0.1', '1.1.1.1']:\n"
        "    try:\n"
        f"        socket.create_connection((host, {port} if host == '127.0.0.1' else 80), timeout=2)\n"
        "        print('CONNECTED', host)\n"
        "    except OSError as exc:\n        print('refused', host, exc.errno)\n"
    )
    result = run(code)
    assert result.passed and "CONNECTED" not in result.stdout
    with pytest.raises(socket.timeout):
        server.accept()  # nobody connected to the host's listener


@needs_bwrap
def test_a_fork_bomb_is_contained_and_leaves_no_process():
    before = len(processes_with("hybridflow-fork-bomb"))
    code = "import os\n# hybridflow-fork-bomb\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    started = time.monotonic()
    result = run(code, limits=SandboxLimits(wall_s=3, memory_mb=256, max_processes=16))
    assert result.status == TIME_LIMIT and time.monotonic() - started < 8
    deadline = time.monotonic() + 5
    while processes_with("main.py") and any(_is_sandboxed(pid) for pid in processes_with("main.py")):
        assert time.monotonic() < deadline, "fork-bomb processes outlived the run"
        time.sleep(0.1)
    assert len(processes_with("hybridflow-fork-bomb")) == before


def _is_sandboxed(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cwd").resolve() == Path("/sandbox") or Path(f"/proc/{pid}").stat().st_uid >= 1_900_000_000
    except OSError:
        return False


def test_a_20_gb_allocation_fails_inside_the_run():
    result = run("x = bytearray(20 * 2**30)\nprint('ALLOCATED')")
    assert result.status == FINISHED and result.return_code == 1
    assert "MemoryError" in result.stderr and "ALLOCATED" not in result.stdout


def test_an_infinite_loop_is_stopped_at_the_wall_clock():
    started = time.monotonic()
    result = run("print('start', flush=True)\nwhile True:\n    pass", limits=SandboxLimits(wall_s=1.5))
    assert result.status == TIME_LIMIT and result.return_code is None
    assert result.stdout == "start\n" and "did not finish within 1.5 s" in result.stderr
    assert time.monotonic() - started < 4


def test_the_cpu_limit_stops_a_busy_program_before_the_wall_clock():
    result = run("while True:\n    pass", limits=SandboxLimits(wall_s=20, cpu_s=1))
    assert result.status == TIME_LIMIT and result.execution_time < 10 and "CPU time limit" in result.stderr


def test_huge_stdout_is_cut_and_the_run_stopped():
    result = run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)")
    assert result.status == OUTPUT_LIMIT and result.stdout == "x" * LIMITS.max_output_bytes
    assert "stdout passed 4096 bytes" in result.stderr


@needs_bwrap
def test_killing_the_parent_or_any_host_process_fails():
    host_pid = os.getpid()
    code = (
        "import os, signal\n"
        f"for pid in [os.getppid(), 1, {host_pid}]:\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n        print('KILLED', pid)\n"
        "    except OSError as exc:\n        print('refused', pid, type(exc).__name__)\n"
    )
    result = run(code)
    assert "KILLED" not in result.stdout, result.stdout
    assert os.getpid() == host_pid  # this process is alive and well


@needs_bwrap
def test_a_child_that_outlives_the_run_is_killed_with_it():
    marker = "hybridflow_sandbox_orphan_4321"
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}], start_new_session=True)\n"
        "print('spawned')\n"
    )
    result = run(code)
    assert result.passed and result.stdout == "spawned\n"
    deadline = time.monotonic() + 5
    while processes_with(marker):
        assert time.monotonic() < deadline, f"the orphan survived: {processes_with(marker)}"
        time.sleep(0.1)


def test_files_are_written_beside_the_program():
    import base64

    result = run("print(open('data/in.txt').read())", files={"data/in.txt": base64.b64encode(b"42").decode()})
    assert result.passed and result.stdout == "42\n"
