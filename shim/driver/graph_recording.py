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

# Loading a module on its first use (the runtime loads them lazily, maybe in a call being
# recorded) is no work of the graph: it goes to the server now, as outside a recording.
PASSED_ON = frozenset({"cuModuleLoadData", "cuModuleGetFunction"})


class Recorder:
    """Stands in for the connection while one call is recorded into graph steps."""

    def __init__(self, what: str) -> None:
        self.what = what  # for messages: "stream capture" or "a graph node"
        self.steps: list[tuple] = []

    def post(self, op: str, *args) -> None:
        if op in PASSED_ON:
            state.connection.post(op, *args)
        else:
            self.steps.append(("wire", op, list(args)))

    def call(self, op: str, *args):
        if op not in PASSED_ON:
            self.refuse(op)
        return state.connection.call(op, *args)

    def frame(self, payload) -> list:
        return state.connection.frame(payload)  # only module loading sends frames here

    def write_device(self, op: str, dst: int, src: int, size: int, *extra) -> None:
        # Pageable host memory: the client copies it itself, when the graph runs.
        self.steps.append(("local", "write_device", (op, dst, src, size, *extra)))

    def read_device(self, op: str, src: int, dst: int, size: int, *extra) -> None:
        self.steps.append(("local", "read_device", (op, src, dst, size, *extra)))

    def host_step(self, run) -> None:
        # A copy between two host buffers: the client's, after the graph's work before it
        # (the launch runs it as it runs a host node's function).
        self.steps.append(("host", run, None))

    def flush(self) -> None:
        pass  # nothing is sent while recording

    def __getattr__(self, name: str):
        self.refuse(name)

    def refuse(self, what: str):
        """Anything that needs an answer from the device now (a synchronization, an
        allocation, a round trip) cannot be part of a graph."""
        raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                        f"an operation that waits for the device ({what}) is not "
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
