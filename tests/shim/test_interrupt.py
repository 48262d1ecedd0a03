"""Ctrl-C of a Python program waiting in a CUDA call raises its KeyboardInterrupt there, at
once, as without vgpu: here its first call, cuInit, waits for a server that never answers
(a raw zmq socket that takes the session's HELLO and stays silent), so the wait is the one
a program meets when its server is slow or stuck. The waits for a kernel are tested through
`vgpu run` in tests/server/test_stopping.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import zmq

PROGRAM = """
from cuda.bindings import driver as cu
print(cu.cuInit(0))
"""


def _terminal_signals() -> None:
    """Ctrl-C not ignored, as in a program started from a shell prompt (the test runner may
    run in the background, where it is)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_of_a_python_program_waiting_for_a_silent_server(shim_dir, tmp_path):
    address = f"ipc://{tmp_path}/silent.sock"
    context = zmq.Context()
    silent = context.socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind(address)
    env = {k: v for k, v in os.environ.items() if k not in ("VGPU_TRACE", "PYTHONPATH")}
    env.update(LD_LIBRARY_PATH=str(shim_dir), VGPU_SERVER=address)
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_terminal_signals)
    try:
        assert silent.poll(60_000), "the program never said HELLO"
        silent.recv_multipart()  # the program now waits for the answer
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        elapsed = time.monotonic() - start
    finally:
        proc.kill()
        silent.close()
        context.term()
    assert proc.returncode == -signal.SIGINT, err  # Python's way to end on KeyboardInterrupt
    assert elapsed < 2.0
    assert out == ""  # cuInit's result never reached the program
    assert err.startswith("Traceback (most recent call last):"), err
    assert err.rstrip().splitlines()[-1] == "KeyboardInterrupt", err
    assert not [line for line in err.splitlines() if line.startswith("vgpu")], err
