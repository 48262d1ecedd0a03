"""The channel between the server and a device process (server/backends/process_channel.py),
its two ends in one process here: objects stay where they live, calls come back for
callbacks, descriptors travel, posted calls run in order and their failure is the next
call's, and messages that arrive together are taken one at a time."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from vgpu.errors import CudaError
from vgpu.server.backends.base import FileDescriptor
from vgpu.server.backends.process_channel import ChannelClosed, Endpoint, RemoteObject


class Device:
    """The far side's root: a log of what ran, a failing call, objects and callbacks."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def note(self, what: str) -> int:
        self.ran.append(what)
        return len(self.ran)

    def fail(self, code: int) -> None:
        self.ran.append(f"fail {code}")
        raise CudaError(code, f"failed with {code}")

    def counter(self) -> Counter:
        return Counter()

    def call_back(self, function, value):
        return function(value) + 1

    def read_file(self, file: FileDescriptor) -> bytes:
        try:
            return os.pread(file.fd, 100, 0)
        finally:
            file.close()


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def add(self, n: int) -> int:
        self.count += n
        return self.count


@pytest.fixture
def channel():
    """(the near Endpoint, the far side's Device), the far side served on a thread."""
    near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    device = Device()
    server = threading.Thread(target=_serve, args=(Endpoint(far, device),), daemon=True)
    server.start()
    yield Endpoint(near, None), device
    near.close()
    server.join(5)
    far.close()


def _serve(endpoint: Endpoint) -> None:
    try:
        endpoint.serve()
    except ChannelClosed:
        pass


def test_objects_stay_where_they_live_and_callbacks_come_back(channel):
    near, _ = channel
    counter = near.call(None, "counter", (), {})
    assert isinstance(counter, RemoteObject)
    assert near.call(counter.number, "add", (2,), {}) == 2
    assert near.call(counter.number, "add", (3,), {}) == 5
    assert near.call(None, "call_back", (lambda v: v * 10, 4), {}) == 41


def test_a_descriptor_travels_as_one_of_the_receivers_own(channel, tmp_path):
    near, _ = channel
    path = tmp_path / "file"
    path.write_bytes(b"through the socket")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert near.call(None, "read_file", (FileDescriptor(os.dup(fd)),), {}) == \
            b"through the socket"
    finally:
        os.close(fd)


def test_posted_calls_run_in_order_and_their_failure_is_the_next_calls(channel):
    near, device = channel
    near.post(None, "note", ("first",), {})
    near.post(None, "fail", (719,), {})
    near.post(None, "note", ("after the failure",), {})  # runs: only calls are stopped
    assert near.call(None, "note", ("released",), {}, takes_held=False) == 4
    with pytest.raises(CudaError) as failed:
        near.call(None, "note", ("not run",), {})
    assert failed.value.code == 719
    assert near.call(None, "note", ("runs again",), {}) == 5
    assert device.ran == ["first", "fail 719", "after the failure", "released",
                          "runs again"]


def test_many_posted_messages_arriving_together_are_taken_one_by_one(channel):
    near, device = channel
    for i in range(2000):
        near.post(None, "note", (f"{i}",), {})
    assert near.call(None, "note", ("last",), {}) == 2001
    assert device.ran[:3] == ["0", "1", "2"] and device.ran[-1] == "last"


def test_a_large_message_arrives_whole(channel):
    near, _ = channel
    big = os.urandom(5 << 20)
    assert near.call(None, "note", (big,), {}) == 1
