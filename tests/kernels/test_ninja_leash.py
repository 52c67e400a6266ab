"""The ninja shim of a kernel build (kernels/ninja_leash.py, build.leashed_ninja): ninja gets SIGTERM when the start
that runs it dies, so a start killed mid-build leaves no compile jobs behind; the shim passes ninja's arguments,
output and exit status through."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from specchat.kernels import build

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the leash is prctl(PR_SET_PDEATHSIG): Linux only")


def fake_ninja(folder: Path) -> Path:
    """A 'ninja' that writes its pid, prints its arguments, and sleeps (SIGTERM ends it, as it ends ninja's jobs)."""
    script = folder / "real-ninja"
    script.write_text(
        textwrap.dedent(f"""\
            #!{sys.executable}
            import os, sys, time
            open(os.environ["PID_FILE"], "w").write(str(os.getpid()))
            print("args", *sys.argv[1:], flush=True)
            if "--sleep" in sys.argv:
                time.sleep(300)
            sys.exit(3)
            """)
    )
    script.chmod(0o700)
    return script


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[1].startswith("Z"))


def test_the_shim_passes_ninjas_arguments_output_and_status_through(tmp_path, monkeypatch):
    real = fake_ninja(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "ninja").symlink_to(real)
    with build.leashed_ninja(tmp_path / "build"):
        shim = Path(subprocess.run(["which", "ninja"], capture_output=True, text=True).stdout.strip())
        assert shim == tmp_path / "build" / "leash" / "ninja"
        done = subprocess.run(
            ["ninja", "-v", "a b"],
            capture_output=True,
            text=True,
            env={**os.environ, "PID_FILE": str(tmp_path / "pid")},
        )
    assert done.returncode == 3 and done.stdout == "args -v a b\n"
    assert not os.environ["PATH"].startswith(str(tmp_path / "build"))  # PATH as it was once the build is done


def test_ninja_dies_with_the_start_that_ran_it(tmp_path, monkeypatch):
    """A start (here: a child process running the shim) SIGKILLed mid-build: its ninja gets SIGTERM and ends."""
    real = fake_ninja(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "ninja").symlink_to(real)
    pid_file = tmp_path / "pid"
    with build.leashed_ninja(tmp_path / "build"):
        starter = subprocess.Popen(
            [sys.executable, "-c", "import subprocess; subprocess.run(['ninja', '--sleep'])"],
            env={**os.environ, "PID_FILE": str(pid_file)},
        )
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    ninja = int(pid_file.read_text())
    assert alive(ninja)
    starter.send_signal(signal.SIGKILL)
    starter.wait()
    deadline = time.monotonic() + 10
    while alive(ninja) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(ninja):
        os.kill(ninja, signal.SIGKILL)
        pytest.fail("ninja ran on after the start that ran it was killed")
