"""The server survives its clients and answers each as the protocol says: garbage, crashes,
disconnects."""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from vgpu.client import BATCHES_PER_MARK, MARKS_IN_FLIGHT, MAX_QUEUED_CALLS, Connection
from vgpu.errors import CudaError, DeviceUnavailable
from vgpu.protocol import ADMIN, CALLS, HELLO, PROTOCOL_VERSION, pack, unpack
from vgpu.server.server import SESSION_QUEUE_LIMIT

CONTEXT = 0x7667_0100_0000_0001


def _ps(address: str) -> list[dict]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    sock.send_multipart([pack([ADMIN, 7, ["ps", []]])])
    assert sock.poll(5000), "server did not answer ps"
    reply = unpack(sock.recv_multipart()[0])
    sock.close()
    return reply[2]


def _open(address: str) -> Connection:
    conn = Connection(address)
    conn.post("cuDevicePrimaryCtxRetain", CONTEXT, 0)
    return conn


def test_allocations_round_trip_and_errors_carry_cuda_codes(server):
    conn = _open(server.address)
    address, _ = conn.call("cuMemAlloc", CONTEXT, 4096)
    data = bytes(range(256)) * 16
    buf = (ctypes.c_char * 4096).from_buffer_copy(data)
    conn.write_device("cuMemcpyHtoD", address, ctypes.addressof(buf), 4096)
    out = (ctypes.c_char * 4096)()
    conn.read_device("cuMemcpyDtoH", address, ctypes.addressof(out), 4096)
    assert bytes(out) == data
    with pytest.raises(CudaError) as err:
        conn.call("cuMemcpyDtoD", address + 4000, address, 200)  # runs past the allocation
    assert err.value.code == 1
    conn.post("cuMemFree", address)
    with pytest.raises(CudaError) as err:
        conn.call("cuMemFree", address)  # double free
    assert err.value.code == 1
    conn.close()


def test_a_digest_of_device_memory_is_its_sha256_within_one_allocation(server):
    conn = _open(server.address)
    address, _ = conn.call("cuMemAlloc", CONTEXT, 4096)
    data = bytes(range(256)) * 16
    buf = (ctypes.c_char * 4096).from_buffer_copy(data)
    conn.write_device("cuMemcpyHtoD", address, ctypes.addressof(buf), 4096)
    assert conn.call("vgpuDigest", address + 16, 100)[0] == hashlib.sha256(data[16:116]).digest()
    for outside in ((address + 4000, 200), (0x1234, 4)):  # past the allocation, in none
        with pytest.raises(CudaError) as err:
            conn.call("vgpuDigest", *outside)
        assert err.value.code == 1
    conn.close()


def test_queued_errors_surface_at_the_next_synchronizing_call(server):
    conn = _open(server.address)
    conn.post("cuMemFree", 0x1234)  # not an allocation: fails, but nobody waits for it
    with pytest.raises(CudaError) as err:
        conn.call("vgpuSynchronize")
    assert err.value.code == 1
    conn.call("vgpuSynchronize")  # reported once, then cleared
    conn.close()


def test_a_queued_error_surfaces_at_the_next_sync_however_much_work_came_after(server):
    conn = _open(server.address)
    target, _ = conn.call("cuMemAlloc", CONTEXT, 4)
    conn.post("cuMemFree", 0x1234)  # fails; then enough work for several answered marks
    for _ in range(3 * BATCHES_PER_MARK * MAX_QUEUED_CALLS):
        conn.post("vgpuMemset", target, b"\x01\0\0\0", 1)
    with pytest.raises(CudaError) as err:
        conn.synchronize()
    assert err.value.code == 1
    conn.synchronize()  # reported once, then cleared
    conn.close()


@pytest.fixture
def raw_client():
    """Opens clients that speak the wire protocol by hand (with `hello`, each opens a
    session); they are closed when the test ends, whether it passed or not."""
    sockets = []

    def open_raw(address: str, hello: bool = False) -> zmq.Socket:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sockets.append(sock)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        if hello:
            assert _exchange(sock, [pack([HELLO, 1, _hello_body("raw")])])[1] == 0
            sock.send(pack([CALLS, 0, [["cuDevicePrimaryCtxRetain", [CONTEXT, 0]]]]))
        return sock

    yield open_raw
    for sock in sockets:
        sock.close()


def _hello_body(argv0: str) -> dict:
    return {"version": PROTOCOL_VERSION, "pid": os.getpid(), "host": socket.gethostname(),
            "argv": [argv0]}


def _exchange(sock: zmq.Socket, frames: list, wait_s: float = 5.0) -> list | None:
    """Send a message; the decoded reply header, or None if none came within `wait_s`."""
    sock.send_multipart(frames)
    if not sock.poll(int(wait_s * 1000)):
        return None
    return unpack(sock.recv_multipart()[0])


# Messages whose header cannot be decoded into [kind, seq, body] with a usable seq: there is
# nobody to answer (no seq to answer to), so the server drops them and says nothing.
UNANSWERABLE = {
    "not msgpack": [b"\xc1garbage"],
    "empty header": [b""],
    "msgpack with trailing bytes": [pack([CALLS, 3, []]) + b"\x00"],
    "a number, not a list": [pack(42)],
    "a list of one": [pack([CALLS])],
    "seq not an integer": [pack([CALLS, "3", []])],
    "seq a boolean": [pack([CALLS, True, []])],
}

# Messages whose seq can be read: each gets the reply the protocol gives, (code, words of
# the message), whether or not the sender has a session.
WITHOUT_SESSION = {
    "header of two fields": ([pack([CALLS, 4])], (1, "malformed message")),
    "header of four fields": ([pack([CALLS, 4, [], 0])], (1, "malformed message")),
    "unknown kind": ([pack(["launch", 4, []])], (1, "unknown message kind")),
    "kind not a string": ([pack([{"a": 1}, 4, []])], (1, "unknown message kind")),
    "calls before hello": ([pack([CALLS, 4, [["cuMemGetInfo", []]]])], (46, "say hello first")),
    "hello of another version": ([pack([HELLO, 4, {"version": PROTOCOL_VERSION + 1}])],
                                 (803, "protocol version mismatch")),
    "hello that is not a map": ([pack([HELLO, 4, "hi"])], (1, "malformed hello")),
    "hello with a pid that is not a number": (
        [pack([HELLO, 4, {**_hello_body("x"), "pid": "me"}])], (1, "malformed hello")),
    # (It goes into `vgpu ps` replies, which a number msgpack cannot carry would break.)
    "hello with a pid that is no process id": (
        [pack([HELLO, 4, {**_hello_body("x"), "pid": 1e300}])], (1, "malformed hello")),
    "hello with argv that is not a list": (
        [pack([HELLO, 4, {**_hello_body("x"), "argv": 5}])], (1, "malformed hello")),
    "unknown admin request": ([pack([ADMIN, 4, ["kill", []]])], (1, "unknown admin request")),
}

WITH_SESSION = {
    "calls that are not a list": ([pack([CALLS, 5, "not a list"])], (1, "malformed call batch")),
    "a call that is not a pair": ([pack([CALLS, 5, [42]])], (1, "malformed or unknown call")),
    "an unknown op": ([pack([CALLS, 5, [["cuNoSuchCall", []]]])],
                      (1, "malformed or unknown call")),
    "an op name that is a map": ([pack([CALLS, 5, [[{"op": 1}, []]]])],
                                 (1, "malformed or unknown call")),
    "too few arguments": ([pack([CALLS, 5, [["cuMemAlloc", ["x"]]]])], (1, "bad arguments")),
    "arguments that are not a list": ([pack([CALLS, 5, [["cuMemAlloc", 7]]])],
                                      (1, "bad arguments")),
    "a size that is a string": ([pack([CALLS, 5, [["cuMemAlloc", [CONTEXT, "big"]]]])],
                                (1, "bad arguments")),
    "a payload frame that was not sent": (
        [pack([CALLS, 5, [["cuMemcpyHtoD", [0x1000_0000_0000, ["frame", 3], 4]]]])],
        (1, "")),
    "a launch of a function never loaded": (
        [pack([CALLS, 5, [["cuLaunchKernel", [77, 1, 1, 1, 1, 1, 1, 0, 0, b""]]]])],
        (400, "")),
}


@pytest.mark.parametrize("frames", UNANSWERABLE.values(), ids=UNANSWERABLE.keys())
def test_an_undecodable_message_gets_no_reply_and_the_server_serves_on(server, raw_client, frames):
    bad = raw_client(server.address, hello=True)
    assert _exchange(bad, frames, wait_s=0.5) is None
    # The sender itself is still served, and so are the others.
    assert _exchange(bad, [pack([CALLS, 8, [["cuMemGetInfo", []]]])])[:2] == [8, 0]
    good = _open(server.address)
    assert good.call("cuMemAlloc", CONTEXT, 1 << 20)[0]
    good.close()


@pytest.mark.parametrize("frames, expected", WITHOUT_SESSION.values(), ids=WITHOUT_SESSION.keys())
def test_a_malformed_message_gets_its_error_and_the_server_serves_on(server, raw_client, frames,
                                                                    expected):
    bad = raw_client(server.address)
    seq, code, result, deferred, output, diagnostics = _exchange(bad, frames)
    assert (seq, code) == (4, expected[0])
    assert expected[1] in result
    assert (deferred, output, diagnostics) == (0, "", "")
    assert not [s for s in _ps(server.address) if s["command"] == "x"]  # no session opened
    good = _open(server.address)
    assert good.call("cuMemAlloc", CONTEXT, 1 << 20)[0]
    good.close()


@pytest.mark.parametrize("frames, expected", WITH_SESSION.values(), ids=WITH_SESSION.keys())
def test_a_malformed_call_fails_with_its_cuda_error(server, raw_client, frames, expected):
    bad = raw_client(server.address, hello=True)
    seq, code, result, deferred, *_ = _exchange(bad, frames)
    assert (seq, code, deferred) == (5, expected[0], 0)
    assert expected[1] in result
    # Queued (nobody waits), the same call fails at the next synchronizing call instead.
    header = unpack(frames[0])
    bad.send(pack([CALLS, 0, header[2]]))
    seq, code, result, (deferred_code, deferred_message), *_ = \
        _exchange(bad, [pack([CALLS, 6, [["vgpuSynchronize", []]]])])
    assert (seq, code, result, deferred_code) == (6, 0, None, expected[0])
    assert expected[1] in deferred_message
    # The session still works, and so do the others.
    assert _exchange(bad, [pack([CALLS, 7, [["cuMemAlloc", [CONTEXT, 4096]]]])])[1] == 0
    good = _open(server.address)
    assert good.call("cuMemAlloc", CONTEXT, 1 << 20)[0]
    good.close()


def test_a_killed_client_releases_its_session_and_memory(server, client_env):
    code = (
        "import sys, time\n"
        "from vgpu.client import Connection\n"
        f"c = Connection(); c.post('cuDevicePrimaryCtxRetain', {CONTEXT}, 0)\n"
        f"c.call('cuMemAlloc', {CONTEXT}, 64 << 20)\n"
        "print('allocated', flush=True); time.sleep(60)\n"
    )
    victim = subprocess.Popen([sys.executable, "-c", code], env=client_env,
                              stdout=subprocess.PIPE, text=True)
    assert victim.stdout.readline().strip() == "allocated"
    sessions = _ps(server.address)
    assert [s["memory"] for s in sessions if s["pid"] == victim.pid] == [64 << 20]
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    victim.stdout.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not any(s["pid"] == victim.pid for s in _ps(server.address)):
            break
        time.sleep(0.2)
    else:
        pytest.fail("the dead client's session was not released")
    assert server.alive()


def test_no_server_gives_device_unavailable_quickly(tmp_path):
    start = time.monotonic()
    with pytest.raises(DeviceUnavailable) as err:
        Connection(f"ipc://{tmp_path}/nobody.sock")
    assert time.monotonic() - start < 10
    assert "no answer from the vgpu server" in str(err.value)
    assert err.value.code == 46


def test_server_death_mid_session_is_device_unavailable(server):
    conn = _open(server.address)
    conn.call("vgpuSynchronize")
    server.proc.kill()
    server.proc.wait()
    with pytest.raises(DeviceUnavailable):
        conn.call("vgpuSynchronize")


# A kernel whose threads count to the number they are given.
SPIN_PTX = (Path(__file__).parent / "programs" / "spin.ptx").read_bytes()


def test_a_long_kernel_does_not_hold_up_other_clients(server):
    busy = _open(server.address)
    module, function = 0x7667_0200_0000_0001, 0x7667_0300_0000_0001
    busy.call("cuModuleLoadData", module, CONTEXT, ["inline", SPIN_PTX], len(SPIN_PTX))
    busy.post("cuModuleGetFunction", function, module, "spin")
    busy.post("cuLaunchKernel", function, 1, 1, 1, 256, 1, 1, 0, 0,
              (200_000).to_bytes(4, "little"))
    kernel_done = threading.Event()
    waiter = threading.Thread(target=lambda: (busy.call("vgpuSynchronize"), kernel_done.set()))
    waiter.start()
    other = _open(server.address)
    for _ in range(5):
        other.call("cuMemGetInfo")  # answered while the kernel is still running
    assert not kernel_done.is_set(), "the other client was served only after the kernel"
    assert _ps(server.address)  # and so is `vgpu ps`
    waiter.join(timeout=120)
    assert kernel_done.is_set()
    other.close()
    busy.close()


def test_a_query_answers_not_ready_while_the_kernel_runs(server):
    conn = _open(server.address)
    module, function = 0x7667_0200_0000_0002, 0x7667_0300_0000_0002
    conn.call("cuModuleLoadData", module, CONTEXT, ["inline", SPIN_PTX], len(SPIN_PTX))
    conn.post("cuModuleGetFunction", function, module, "spin")
    conn.post("cuLaunchKernel", function, 1, 1, 1, 256, 1, 1, 0, 0,
              (200_000).to_bytes(4, "little"))
    assert conn.query() is False  # answered at once, the kernel still running
    conn.synchronize()
    assert conn.query() is True
    conn.close()


def test_a_program_that_queues_faster_than_the_device_runs_waits_for_it(server):
    """CUDA's queue is bounded: a launch blocks when it is full. vgpu's too, so a program
    queueing without end cannot pile up calls in the server's memory."""
    conn = _open(server.address)
    module, function = 0x7667_0200_0000_0003, 0x7667_0300_0000_0003
    conn.call("cuModuleLoadData", module, CONTEXT, ["inline", SPIN_PTX], len(SPIN_PTX))
    conn.post("cuModuleGetFunction", function, module, "spin")
    target, _ = conn.call("cuMemAlloc", CONTEXT, 4)
    conn.post("cuLaunchKernel", function, 1, 1, 1, 256, 1, 1, 0, 0,
              (500_000).to_bytes(4, "little"))  # holds the device for a second or two
    posted = threading.Event()

    def flood() -> None:
        for _ in range(60_000):
            conn.post("vgpuMemset", target, b"\x07\0\0\0", 1)
        posted.set()

    poster = threading.Thread(target=flood)
    poster.start()
    peak = 0
    while not posted.is_set():
        mine = [s["queued"] for s in _ps(server.address) if s["pid"] == os.getpid()]
        peak = max([peak, *mine])
        time.sleep(0.02)
    poster.join()
    conn.synchronize()
    bound = (MARKS_IN_FLIGHT + 2) * BATCHES_PER_MARK * MAX_QUEUED_CALLS
    assert MAX_QUEUED_CALLS * BATCHES_PER_MARK < peak <= bound
    out = (ctypes.c_uint32 * 1)()
    conn.read_device("cuMemcpyDtoH", target, ctypes.addressof(out), 4)
    assert out[0] == 7
    conn.close()


def test_a_client_that_floods_the_queue_without_waiting_is_cut_off(server):
    """Not a vgpu client (those wait when the queue is full): one that sends work without
    end. The server drops it before it runs out of memory and serves the others."""
    flood = zmq.Context.instance().socket(zmq.DEALER)
    flood.setsockopt(zmq.LINGER, 0)
    flood.connect(server.address)
    hello = {"version": PROTOCOL_VERSION, "pid": os.getpid(), "host": socket.gethostname(),
             "argv": ["flood"]}
    flood.send(pack([HELLO, 1, hello]))
    assert flood.poll(5000) and unpack(flood.recv())[1] == 0
    module, function = 0x7667_0200_0000_0004, 0x7667_0300_0000_0004
    # A kernel that would run for hours keeps the queue from draining however slowly the
    # flood arrives; cutting the client off stops it (else the server's teardown fails).
    setup = [["cuDevicePrimaryCtxRetain", [CONTEXT, 0]],
             ["cuModuleLoadData", [module, CONTEXT, ["inline", SPIN_PTX], len(SPIN_PTX)]],
             ["cuModuleGetFunction", [function, module, "spin"]],
             ["cuLaunchKernel", [function, 1, 1, 1, 256, 1, 1, 0, 0,
                                 (2_000_000_000).to_bytes(4, "little")]]]
    flood.send(pack([CALLS, 0, setup]))
    batch = pack([CALLS, 0, [["vgpuSynchronize", []]] * MAX_QUEUED_CALLS])
    for _ in range(SESSION_QUEUE_LIMIT // MAX_QUEUED_CALLS + 8):
        flood.send(batch)
    flood.send(pack([CALLS, 2, [["vgpuSynchronize", []]]]))
    seq = 0
    while seq == 0:  # (keepalives come while the kernel runs, if the flood takes long)
        assert flood.poll(20000)
        seq, code, *_ = unpack(flood.recv())
    assert (seq, code) == (2, 46)  # the session is gone: "no session"
    assert not [s for s in _ps(server.address) if s["command"] == "flood"]
    other = _open(server.address)
    assert other.call("cuMemAlloc", CONTEXT, 4096)[0]
    other.close()
    flood.close()


def test_a_kernel_longer_than_the_client_timeout_is_waited_for(server):
    """VGPU_TIMEOUT bounds silence, not work: a busy server says it is alive."""
    conn = Connection(server.address, timeout=1.0)
    conn.post("cuDevicePrimaryCtxRetain", CONTEXT, 0)
    module, function = 0x7667_0200_0000_0005, 0x7667_0300_0000_0005
    conn.call("cuModuleLoadData", module, CONTEXT, ["inline", SPIN_PTX], len(SPIN_PTX))
    conn.post("cuModuleGetFunction", function, module, "spin")
    conn.post("cuLaunchKernel", function, 1, 1, 1, 256, 1, 1, 0, 0,
              (1_000_000).to_bytes(4, "little"))  # several seconds on the emulator
    start = time.monotonic()
    conn.synchronize()
    assert time.monotonic() - start > 1.0  # it did outlast the timeout
    assert conn.call("cuMemGetInfo")[0]
    conn.close()


def test_a_stopped_server_is_device_unavailable_within_the_timeout(server):
    conn = Connection(server.address, timeout=1.0)
    conn.call("vgpuSynchronize")
    server.proc.send_signal(signal.SIGSTOP)  # alive, but silent
    try:
        start = time.monotonic()
        with pytest.raises(DeviceUnavailable):
            conn.call("cuMemGetInfo")
        assert time.monotonic() - start < 5
    finally:
        server.proc.send_signal(signal.SIGCONT)
        conn.close()
