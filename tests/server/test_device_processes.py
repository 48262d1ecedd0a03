"""The proxy that runs a session's backend in a device process of its own
(server/backends/isolated.py), on the emulator: what the backend contract suite (which runs
it as `emu-process` and `cuda-process`) does not ask of a backend. A session's end stops a
kernel that would never finish; a device process that dies takes only its session's device
work, which a recovery brings back in a fresh process; another session's objects are refused
with CUDA's error; errors raised on either side of a call come back whole; no descriptor is
left behind."""

from __future__ import annotations

import mmap
import os
import signal
import struct
import threading
import time

import pytest

from vgpu.errors import CudaError
from vgpu.sealed_files import sealed_file
from vgpu.server.backends import open_backend
from vgpu.server.backends.base import Cancelled, KernelFault
from vgpu.server.server import ARENA_BASE

PTX = b"""
.version 7.0
.target sm_70
.address_size 64

.visible .global .align 4 .u32 counter;

.visible .entry spin(.param .u64 flag)
{
    .reg .u32 %r<2>;
    .reg .u64 %rd<2>;
    .reg .pred %p;
    ld.param.u64 %rd1, [flag];
LOOP:
    ld.volatile.global.u32 %r1, [%rd1];
    setp.eq.u32 %p, %r1, 0;
    @%p bra LOOP;
    ret;
}

.visible .entry wild()
{
    .reg .u64 %rd<2>;
    mov.u64 %rd1, 64;
    st.global.u32 [%rd1], 7;
    ret;
}
"""
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_LAUNCH_FAILED = 719
CUDA_ERROR_NOT_SUPPORTED = 801
MIB = 1 << 20


@pytest.fixture
def backends():
    """make(): a backend in a device process of its own with an arena attached; all closed
    at the end."""
    made = []

    def make():
        backend = open_backend("emu", own_process=True)
        backend.attach_arena(ARENA_BASE, 1 << 36)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def loaded(backend):
    places = iter(range(ARENA_BASE + 64 * MIB, ARENA_BASE + 128 * MIB, 4096))
    return backend.load_module(PTX, lambda size, managed=False: next(places))


def launch(backend, module, kernel: str, *words: int) -> tuple[str, str]:
    params = b"".join(struct.pack("<Q", w) for w in words)
    return backend.prepare_launch(module, kernel, (1, 1, 1), (1, 1, 1), 0)(params, 1 << 20)


def test_ending_a_session_stops_a_kernel_that_would_never_finish(backends):
    backend = backends()
    flag = ARENA_BASE
    backend.map(flag, 4096)
    backend.fill(flag, b"\0\0\0\0", 1)
    module = loaded(backend)
    ended: list[BaseException] = []

    def run() -> None:
        try:
            launch(backend, module, "spin", flag)
        except BaseException as exc:  # noqa: BLE001  (what the launch ended with)
            ended.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    time.sleep(0.5)
    assert runner.is_alive(), "the spinning kernel returned"
    backend.cancel()
    runner.join(10)
    assert not runner.is_alive() and len(ended) == 1 and isinstance(ended[0], Cancelled)
    assert not _alive(backend.pid)
    backend.unmap(flag)  # what the session's end releases still can be


def test_a_fault_comes_back_whole_and_the_session_recovers_in_a_fresh_process(backends):
    backend = backends()
    module = loaded(backend)
    with pytest.raises(KernelFault) as fault:
        launch(backend, module, "wild")
    assert fault.value.code == CUDA_ERROR_ILLEGAL_ADDRESS
    assert "0x40" in fault.value.diagnostics + fault.value.message
    first = backend.pid
    backend.unload_module(module)
    backend.recover()
    assert backend.pid != first and not _alive(first)
    backend.map(ARENA_BASE, 4096)
    backend.write(ARENA_BASE, memoryview(b"again"))
    out = bytearray(5)
    backend.read_into(ARENA_BASE, memoryview(out))
    assert out == b"again"


def test_a_device_process_that_dies_fails_only_its_own_session(backends):
    victim, neighbour = backends(), backends()
    for backend in (victim, neighbour):
        backend.map(ARENA_BASE, 4096)
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(KernelFault) as lost:
        victim.write(ARENA_BASE, memoryview(b"x"))
    assert lost.value.code == CUDA_ERROR_LAUNCH_FAILED
    assert "device process ended" in lost.value.message
    victim.unmap(ARENA_BASE)  # releasing what went with the process succeeds
    neighbour.write(ARENA_BASE, memoryview(b"fine"))
    out = bytearray(4)
    neighbour.read_into(ARENA_BASE, memoryview(out))
    assert out == b"fine"
    victim.recover()
    victim.map(ARENA_BASE, 4096)
    victim.write(ARENA_BASE, memoryview(b"back"))


def test_another_sessions_event_is_waited_for_but_not_recorded(backends):
    mine, theirs = backends(), backends()
    event = theirs.create_event(0, True)
    theirs.record_event(event, 0)
    mine.wait_event(0, event)  # the server waits for it in place of the device
    assert mine.event_done(event)
    with pytest.raises(CudaError) as refused:
        mine.record_event(event, 0)
    assert refused.value.code == CUDA_ERROR_NOT_SUPPORTED


def test_a_callbacks_error_reaches_the_caller_with_its_code(backends):
    backend = backends()

    def no_room(size: int, managed: bool = False) -> int:
        raise CudaError(CUDA_ERROR_OUT_OF_MEMORY, f"no room for {size} bytes")

    with pytest.raises(CudaError) as failed:
        backend.load_module(PTX, no_room)
    assert failed.value.code == CUDA_ERROR_OUT_OF_MEMORY
    assert failed.value.message == "no room for 4 bytes"


def _host_buffer_descriptors() -> int:
    """This process's descriptors of the test's host buffers (sealed files named
    "vgpu-test-host"): other descriptors come and go with the device processes' pipes."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += "vgpu-test-host" in os.readlink(f"/proc/self/fd/{name}")
        except OSError:   # the listing's own descriptor, or one closed meanwhile
            pass
    return count


def test_host_buffers_leave_no_descriptor_behind(backends):
    backend = backends()
    before = _host_buffer_descriptors()
    for _ in range(20):
        fd = sealed_file("vgpu-test-host", 4096)
        try:
            mapping = mmap.mmap(fd, 4096)
            view = memoryview(mapping)
            address = 0x7000_0000_0000
            assert backend.map_host(address, 4096, view, fd) is None
            backend.write(address, memoryview(b"seen"))
            assert mapping[:4] == b"seen"
            backend.unmap(address)
            view.release()
            mapping.close()
        finally:
            os.close(fd)
    assert _host_buffer_descriptors() == before == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_copies_between_device_memory_and_a_shown_host_buffer(backends):
    """Copies whose host side lies in a client's page-locked buffer (which the device
    process maps too) go straight between it and the device, large ones included."""
    backend = backends()
    size = 12 * MIB  # more than the staging file's piece
    fd = sealed_file("pinned", size)
    mapping = mmap.mmap(fd, size)
    view = memoryview(mapping)
    try:
        assert backend.map_host(0x7100_0000_0000, size, view, fd) is None
        device = ARENA_BASE
        backend.map(device, size)
        pattern = bytes(range(256)) * (size // 256)
        view[:] = pattern
        backend.write(device, view[MIB:])
        view[:] = bytes(size)
        backend.read_into(device, view[:size - MIB])
        assert view[:size - MIB] == pattern[MIB:]
    finally:
        backend.unmap(0x7100_0000_0000)
        view.release()
        mapping.close()
        os.close(fd)


def test_another_sessions_event_whose_process_died_is_complete(backends):
    """An IPC event's session is not this one: its process's death fails nothing here."""
    mine, theirs = backends(), backends()
    event = theirs.create_event(0, True)
    theirs.record_event(event, 0)
    os.kill(theirs.pid, signal.SIGKILL)
    mine.map(ARENA_BASE, 4096)
    mine.wait_event(0, event)
    assert mine.event_done(event)
    mine.synchronize_event(event)
    mine.write(ARENA_BASE, memoryview(b"still mine"))
