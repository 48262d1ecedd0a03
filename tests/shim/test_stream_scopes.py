"""A copy issued on a stream waits for that stream's work, whichever other host threads
issue copies on their own streams meanwhile (the program's threads share one connection,
and the server one scope per session: see Connection.issued_on)."""

from __future__ import annotations

import sys
from pathlib import Path

from vgpu_processes import emu_server, run_under_vgpu

PROGRAM = Path(__file__).resolve().parent / "programs" / "copies_from_threads.py"
# The kernel's loop: about a third of a second on the interpreter, where a copy that does
# not wait for it reads the memory within milliseconds.
SPIN = 50_000


def test_a_copy_waits_for_its_own_streams_kernel_while_another_thread_copies(tmp_path):
    # On the interpreter, whose pace SPIN is counted for (compiled, the loop is a thousand
    # times faster).
    with emu_server(tmp_path, "--no-compile") as address:
        result = run_under_vgpu(address, sys.executable, PROGRAM, str(SPIN), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "A read 42, B read 7", result.stdout + result.stderr
