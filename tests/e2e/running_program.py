"""A program running under `vgpu run` whose output a test reads line by line while it runs,
and the pause file the state programs (programs/state_loop.c says how) obey."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from vgpu_processes import VGPU, vgpu_environment

__all__ = ["RunningProgram", "pause_at"]


def pause_at(pause_file: Path, iteration: int) -> None:
    """Ask the program to pause before `iteration` (and run on until then). Written whole,
    then renamed, so that the program never reads half a number."""
    part = pause_file.with_name(pause_file.name + ".part")
    part.write_text(f"{iteration}\n")
    os.replace(part, pause_file)


class RunningProgram:
    """`vgpu run -- COMMAND` in a process group of its own (`vgpu run` and the program both:
    `stop` ends them together). `env` adds to vgpu_environment()."""

    def __init__(self, command: list, timeout: float, **env: str):
        self.timeout = timeout
        self.proc = subprocess.Popen([*VGPU, "run", "--", *map(str, command)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=vgpu_environment(**env), start_new_session=True)
        self.lines: list[str] = []
        self._stderr: list[str] = []
        self._changed = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.lines),
                                          daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr,
                                                                    self._stderr), daemon=True)]
        for reader in self._readers:
            reader.start()
        self.pid = int(self.wait_for("pid ").split()[1])  # the program's, which servers list

    def _read(self, stream, into: list[str]) -> None:
        for line in stream:
            with self._changed:
                into.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def stderr(self) -> str:
        return "\n".join(self._stderr)

    def transcript(self) -> str:
        return ("--- stdout\n" + "\n".join(self.lines) + "\n--- stderr\n" + self.stderr
                + f"\n--- exit status {self.proc.poll()}")

    def wait_for(self, line_start: str) -> str:
        """The first output line that starts with `line_start`, once the program printed it;
        a program that exits or takes longer than the timeout first fails the test."""
        deadline = time.monotonic() + self.timeout
        with self._changed:
            while True:
                found = next((line for line in self.lines if line.startswith(line_start)), None)
                if found is not None:
                    return found
                if not self._readers[0].is_alive():
                    raise AssertionError(f"the program ended without printing {line_start!r}\n"
                                         + self.transcript())
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {line_start!r} within {self.timeout} s\n"
                                         + self.transcript())
                self._changed.wait(left)

    def finish(self) -> int:
        """The program's exit status, once it and its output ended (within the timeout)."""
        try:
            code = self.proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the program did not end within {self.timeout} s\n"
                                 + self.transcript()) from None
        for reader in self._readers:
            reader.join(timeout=self.timeout)
        return code

    def stop(self) -> None:
        """End `vgpu run` and the program if they still run (a failed test's leftovers: the
        program may outlive `vgpu run`, in the group)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=self.timeout)
        for reader in self._readers:
            reader.join(timeout=self.timeout)
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()
