"""What a graph node does, recorded by running the call it stands for.

A kernel node is a launch, a memcpy node a copy, a memset node a memset: the driver layer
already checks their arguments and turns them into wire calls. Building such a node (or
capturing such a call on a capturing stream) runs that same code with the calling thread's
connection replaced by a Recorder, which keeps the calls instead of sending them. So a graph
runs exactly what the same calls on a stream would have run.
"""

from __future__ import annotations

import contextlib

from ._state import CudaError, E, state


class Recorder:
    """Stands in for the connection while one call is recorded into graph steps."""

    def __init__(self, what: str) -> None:
        self.what = what  # for messages: "stream capture" or "a graph node"
        self.steps: list[tuple] = []

    def post(self, op: str, *args) -> None:
        self.steps.append(("wire", op, list(args)))

    def write_device(self, op: str, dst: int, src: int, size: int, *extra) -> None:
        # Pageable host memory: the client copies it itself, when the graph runs.
        self.steps.append(("local", "write_device", (op, dst, src, size, *extra)))

    def read_device(self, op: str, src: int, dst: int, size: int, *extra) -> None:
        self.steps.append(("local", "read_device", (op, src, dst, size, *extra)))

    def flush(self) -> None:
        pass  # nothing is sent while recording

    def __getattr__(self, name: str):
        # Anything that needs an answer from the device now (a synchronization, an
        # allocation, a round trip) cannot be part of a graph.
        raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                        f"an operation that waits for the device ({name}) is not "
                        f"permitted in {self.what}")


@contextlib.contextmanager
def recording(what: str):
    """Record the driver calls made inside the block; yields the Recorder."""
    outer = state.thread.recording
    recorder = Recorder(what)
    state.start_recording(recorder)
    try:
        yield recorder
    finally:
        state.stop_recording(restore=outer)
