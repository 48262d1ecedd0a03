"""The server survives whatever arrives: hypothesis sends it random bytes, truncated and
oversized messages, wrong versions and types, valid messages out of order and calls with
huge counts and sizes, each example from a client of its own, against one server process.

After every example the server still answers (no crash, no hang); after all of them, a
session opened before the fuzzing holds its data and runs calls as before (no effect on
another session), no fuzzing session is left, and the server holds no more files or maps
than before (no leak); its log has no internal error.

The number of examples is bounded for CI; for a longer local run:
    VGPU_FUZZ_PROFILE=vgpu-fuzz-long pytest tests/server/test_message_fuzzing.py
"""

from __future__ import annotations

import ctypes
import os
import time

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vgpu_processes import start_emu_server, stop_server

from vgpu.client import Connection
from vgpu.protocol import ADMIN, BYE, CALLS, HELLO, HOSTFN, PROTOCOL_VERSION, RELEASE
from vgpu.sealed_files import sealed_file
from vgpu.server.session import OPS

CONTEXT = 0x7667_0100_0000_0001
# A memory file a fuzzed hello may offer as its staging ring, by descriptor (copies may write
# into it: never offer a file that matters); open for as long as the tests run.
SEGMENT = sealed_file("vgpu-fuzz", 1 << 16)
ANSWER_S = 10  # a server that has not answered a request in this long is hung

settings.register_profile("vgpu-fuzz", max_examples=60, deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.function_scoped_fixture,
                                                 HealthCheck.data_too_large])
settings.register_profile("vgpu-fuzz-long", parent=settings.get_profile("vgpu-fuzz"),
                          max_examples=5000)
FUZZ = settings.get_profile(os.environ.get("VGPU_FUZZ_PROFILE", "vgpu-fuzz"))


class Fuzzed:
    """The server under fuzzing, and a session of a well-behaved client beside the fuzzers."""

    def __init__(self, folder):
        self.address = f"ipc://{folder}/server.sock"
        self.log = folder / "server.log"
        with self.log.open("w") as log:
            self.proc = start_emu_server(self.address, "-v", stderr=log)
        self.context = zmq.Context()
        self.control = Connection(self.address)
        self.control.post("cuDevicePrimaryCtxRetain", CONTEXT, 0)
        self.pointer, _ = self.control.call("cuMemAlloc", CONTEXT, 1 << 16)
        self.contents = os.urandom(1 << 16)
        buffer = ctypes.create_string_buffer(self.contents, len(self.contents))
        self.control.write_device("cuMemcpyHtoD", self.pointer, ctypes.addressof(buffer),
                                  len(self.contents))
        self.control.synchronize()
        self.files, self.maps = self.held()

    def held(self) -> tuple[int, int]:
        """Open files, and files mapped that are not code, of the server process."""
        pid = self.proc.pid
        with open(f"/proc/{pid}/maps") as maps:
            files = [line.split(maxsplit=5)[5] for line in maps if line.count(" /") == 1]
        return len(os.listdir(f"/proc/{pid}/fd")), \
            sum(1 for f in files if ".so" not in f and "python" not in f and "/usr/" not in f)

    def send(self, messages: list[list[bytes]]) -> None:
        """Send `messages` from a client of their own, then make sure the server still
        answers that client, and let it go."""
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        try:
            for frames in messages:
                sock.send_multipart(frames)
            probe = 2**62
            sock.send(msgpack.packb([ADMIN, probe, ["ps", []]]))
            while True:
                assert sock.poll(ANSWER_S * 1000), "the server stopped answering"
                reply = msgpack.unpackb(sock.recv_multipart()[0], strict_map_key=False)
                if reply[0] == probe:
                    break
            sock.send(msgpack.packb([BYE, 0, None]))
        finally:
            sock.close(linger=1000)  # the goodbye must go
        assert self.proc.poll() is None, "the server died"

    def check_control(self) -> None:
        out = ctypes.create_string_buffer(len(self.contents))
        self.control.read_device("cuMemcpyDtoH", self.pointer, ctypes.addressof(out),
                                 len(self.contents))
        assert out.raw == self.contents
        second, _ = self.control.call("cuMemAlloc", CONTEXT, 4096)
        self.control.call("cuMemFree", second)

    def close(self) -> str:
        self.control.close()
        self.context.term()
        stop_server(self.proc)
        return self.log.read_text()


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    server = Fuzzed(tmp_path_factory.mktemp("fuzzed"))
    yield server
    log = server.close()
    assert "internal error" not in log and "Traceback" not in log, log[-4000:]


@pytest.fixture
def server(fuzzed):
    """The fuzzed server; after the test, its control session still works."""
    yield fuzzed
    fuzzed.check_control()


# ----------------------------------------------------------------- values

HUGE = st.sampled_from([2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1, -(2**63), -1, 1 << 40])
INTS = st.one_of(st.integers(-4, 70000), HUGE, st.integers(-(2**63), 2**64 - 1))
SCALARS = st.one_of(st.none(), st.booleans(), INTS, st.floats(allow_nan=True),
                    st.text(max_size=40), st.binary(max_size=64))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=10), inner, max_size=6)),
    max_leaves=20)
KINDS = st.one_of(st.sampled_from([HELLO, CALLS, ADMIN, BYE, RELEASE, HOSTFN]), SCALARS)
SPECS = st.one_of(
    st.tuples(st.just("frame"), INTS), st.tuples(st.just("shm"), INTS),
    st.tuples(st.just("seg"), INTS, INTS), st.tuples(st.just("inline"), st.binary(max_size=64)),
    st.tuples(st.just("peer"), INTS), VALUES)
ARGS = st.lists(st.one_of(INTS, INTS, SPECS, VALUES), max_size=8)
CALL = st.one_of(st.tuples(st.sampled_from(sorted(OPS)), ARGS), VALUES)
PAYLOADS = st.lists(st.binary(max_size=256), max_size=3)


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


@st.composite
def hellos(draw) -> dict:
    """Hellos, mostly well formed, with fields replaced by anything."""
    body = {"version": PROTOCOL_VERSION, "pid": 1, "host": "fuzz", "argv": ["fuzz"],
            "shm": None, "probe": None, "memcheck": None, "token": "f" * 32, "resume": None}
    wild = {
        "version": st.one_of(st.just(PROTOCOL_VERSION), INTS, SCALARS),
        "pid": st.one_of(INTS, SCALARS), "host": SCALARS, "argv": VALUES,
        "shm": st.one_of(st.none(), st.fixed_dictionaries({
            "fd": st.one_of(st.sampled_from([SEGMENT, 0, 1, 2, -1]), INTS, SCALARS),
            "size": INTS}), VALUES),
        "probe": st.one_of(st.none(), st.tuples(INTS, st.binary(max_size=32)), VALUES),
        "memcheck": SCALARS, "token": st.one_of(st.text(max_size=40), SCALARS),
        "resume": st.one_of(st.none(), st.fixed_dictionaries({"position": INTS}),
                            st.fixed_dictionaries({"position": INTS, "waiting": VALUES}),
                            VALUES),
        "arena": st.one_of(INTS, VALUES),
    }
    for key in draw(st.lists(st.sampled_from(sorted(wild)), max_size=4, unique=True)):
        body[key] = draw(wild[key])
    return body


@st.composite
def conversations(draw) -> list[list[bytes]]:
    """Valid-looking messages of a client, in any order: hellos, batches of calls with
    payload frames, admin requests, releases and goodbyes."""
    messages = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from([HELLO, CALLS, CALLS, CALLS, ADMIN, RELEASE, HOSTFN, BYE]))
        seq = draw(st.one_of(st.integers(0, 1000), INTS))
        if kind == HELLO:
            body = draw(hellos())
        elif kind == CALLS:
            body = draw(st.lists(CALL, max_size=5))
        elif kind == ADMIN:
            body = draw(st.one_of(
                st.tuples(st.sampled_from(["ps", "checkpoint", "suspend", "resume", "migrate",
                                           "adopt"]), st.tuples(VALUES)), VALUES))
        else:
            body = draw(VALUES)
        messages.append([pack([kind, seq, body]), *draw(PAYLOADS)])
    return messages


# ----------------------------------------------------------------- tests

@FUZZ
@given(st.lists(st.lists(st.binary(max_size=512), min_size=1, max_size=4), max_size=4))
def test_random_bytes(server, messages):
    server.send(messages)


@FUZZ
@given(st.lists(st.tuples(KINDS, st.one_of(INTS, SCALARS), VALUES), max_size=4), PAYLOADS)
def test_headers_of_wrong_types(server, headers, payloads):
    server.send([[pack(list(h)), *payloads] for h in headers])


@FUZZ
@given(st.lists(VALUES, max_size=4))
def test_headers_of_wrong_shapes(server, headers):
    server.send([[pack(h)] for h in headers])


@FUZZ
@given(conversations(), st.data())
def test_truncated_messages(server, messages, data):
    cut = []
    for frames in messages:
        header = frames[0]
        cut.append([header[:data.draw(st.integers(0, max(0, len(header) - 1)))], *frames[1:]])
    server.send(cut)


@FUZZ
@given(conversations())
def test_valid_messages_in_any_order(server, messages):
    server.send(messages)


@FUZZ
@given(hellos(), st.lists(st.lists(CALL, max_size=5), max_size=4), PAYLOADS)
def test_calls_of_an_open_session(server, hello, batches, payloads):
    messages = [[pack([HELLO, 1, {**hello, "version": PROTOCOL_VERSION}])]]
    messages += [[pack([CALLS, i + 2, batch]), *payloads] for i, batch in enumerate(batches)]
    server.send(messages)


@FUZZ
@given(st.integers(1, 2**32), st.sampled_from(["cuMemAlloc", "vgpuMemset", "cuMemcpyHtoD",
                                                 "cuMemcpyDtoH", "vgpuDigest", "cuMemAllocHost",
                                                 "vgpuTransfer"]))
def test_huge_counts_and_sizes(server, size, op):
    args = {"cuMemAlloc": [CONTEXT, size], "vgpuMemset": [server.pointer, b"\0", size],
            "cuMemcpyHtoD": [server.pointer, ["frame", 0], size],
            "cuMemcpyDtoH": [server.pointer, size, ["frame"]],
            "vgpuDigest": [server.pointer, size], "cuMemAllocHost": [size],
            "vgpuTransfer": ["HtoD", size]}[op]
    hello = {"version": PROTOCOL_VERSION, "pid": 1, "host": "fuzz", "argv": ["fuzz"],
             "shm": None, "probe": None, "token": "e" * 32, "resume": None}
    server.send([[pack([HELLO, 1, hello])],
                 [pack([CALLS, 2, [["cuDevicePrimaryCtxRetain", [CONTEXT, 0]], [op, args]]]),
                  b"x" * 64]])


def test_nothing_is_left_behind(server):
    """(Runs last in this module.) Only the control session remains, and the server holds
    the files and maps it held before the fuzzing."""
    sock = server.context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.address)
    sock.send(pack([ADMIN, 1, ["ps", []]]))
    assert sock.poll(ANSWER_S * 1000)
    sessions = msgpack.unpackb(sock.recv(), strict_map_key=False)[2]
    sock.close()
    assert [s["pid"] for s in sessions] == [os.getpid()]
    # (Connections and sessions just closed take the server a moment to let go of.)
    deadline = time.monotonic() + 5
    while server.held() != (server.files, server.maps) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.held() == (server.files, server.maps)
