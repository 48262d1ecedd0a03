"""What every backend does, checked the same way on each (conftest.py says how `cuda` runs
without a GPU): memory at the arena's addresses, copies and fills, modules and their
variables, launches with a parameter buffer, device printf and assert, faults, cancelling,
the virtual memory API's physical memory, events, and memory contents taken from one backend
and put back on a fresh one (of either kind) at the same addresses, as checkpoints and
migrations do.

Streams are the session's lanes on a backend whose launches run inline (server/streams.py),
the device's on one that runs them itself: a kernel held on one stream while the device's
events order another is checked where the backend runs streams (`cuda`); the session tests
and the end-to-end programs cover the lanes.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import struct
import threading

import pytest
from contract_device import KINDS, f32, f64, i32, pack, ptr

from vgpu.errors import CudaError
from vgpu.sealed_files import sealed_file
from vgpu.server.backends.base import Cancelled, KernelFault

MIB = 1 << 20
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_ASSERT = 710
CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1
CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
READ, READ_WRITE = 1, 3
QUERIES = 200  # how many times a test asks whether work that must wait is done yet


def floats(data: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(data) // 4}f", data))


def as_floats(values) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


# ----------------------------------------------------------------- the device

def test_the_device_is_described(device):
    described = device.backend.describe()
    assert described.name and len(described.uuid) == 16
    assert described.total_memory >= 256 * MIB
    assert described.compute_capability >= (5, 0)
    assert described.attributes[CU_DEVICE_ATTRIBUTE_WARP_SIZE] == 32
    assert described.attributes[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK] >= 512
    assert described.attributes[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT] >= 1


def test_two_devices_hold_memory_and_run_kernels_over_each_others(kind, make_device, kernels):
    """emu's devices are views of one; cuda's are the driver's GPUs (nested: the two an emu
    server offers). Memory on each, a module on each: a kernel on device 1 reads device 0's
    memory and writes its own, copies go between them, and device 1's physical memory is
    read and written as checkpoints and restores do."""
    device = make_device(kind, devices=2)
    backend = device.backend
    if (backend.devices_driven() or 2) < 2:
        pytest.skip("the driver here offers one GPU")
    assert backend.describe_device(0).uuid != backend.describe_device(1).uuid
    assert backend.can_access_peer(1, 0) and backend.can_access_peer(0, 1)
    assert not backend.can_access_peer(1, 1)
    x = [i * 0.5 for i in range(300)]
    source = device.upload(as_floats(x), device=0)
    result = device.upload(bytes(4 * len(x)), device=1)
    assert result >= device.arena.region_starts()[1] > source
    if kind == "cuda":  # each device's memory where its driver says it is
        from cuda.bindings import driver as cu

        ordinal = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        with backend.running():
            found = [cu.cuPointerGetAttribute(ordinal, a) for a in (source, result)]
        assert [(int(error), value) for error, value in found] == [(0, 0), (0, 1)]
    module = device.load(kernels.ptx, device=1)
    device.launch(module, "axpb", 2, 256, ptr(result), ptr(source), f32(2.0), i32(len(x)),
                  f64(1.0))
    assert floats(device.read(result, 4 * len(x))) == [2.0 * v + 1.0 for v in x]
    with backend.running():
        backend.copy(source, result + 4, 8)
        backend.fill(result, b"\x07", 4)
    assert floats(device.read(source, 8)) == [2.0 * v + 1.0 for v in x[1:3]]
    assert device.read(result, 4) == b"\x07" * 4
    counter = module.variables["counter"][0]
    assert device.region_of(counter) == 1 and device.read(counter, 4) == i32(1000)
    with backend.running():  # a checkpoint's and a restore's copies of device 1's memory
        contents = bytearray(b"on device 1".ljust(2 * MIB, b"\0"))
        physical = backend.create_physical(2 * MIB, contents, device=1)
        out = bytearray(11)
        backend.read_physical(physical, 0, memoryview(out))
        backend.release_physical(physical)
    assert out == b"on device 1"


# ----------------------------------------------------------------- memory at fixed addresses

def test_memory_at_the_arenas_addresses_keeps_what_is_written(device):
    """Sizes below, at and across the 2 MiB granules a GPU maps; several small allocations
    share a granule."""
    sizes = (1, 512, 1000, 3 * MIB + 100, 4096, 2 * MIB)
    placed = {}
    for size in sizes:
        data = os.urandom(size)
        placed[device.upload(data)] = data
    assert all(device.arena.base <= a < device.arena.base + device.arena.size for a in placed)
    for address, data in placed.items():
        assert device.read(address, len(data)) == data
    # Parts of an allocation, at odd offsets.
    address, data = next((a, d) for a, d in placed.items() if len(d) > MIB)
    device.write(address + 3, b"\xab" * 5)
    assert device.read(address, 10) == data[:3] + b"\xab" * 5 + data[8:10]


def test_freeing_an_allocation_leaves_its_neighbours_in_the_same_granule(device):
    first, second, third = (device.upload(bytes([n]) * 512) for n in (1, 2, 3))
    assert second == first + 512 and third == second + 512
    device.free(second)
    assert device.read(first, 512) == b"\1" * 512 and device.read(third, 512) == b"\3" * 512
    again = device.upload(b"\4" * 512, at=second)
    assert device.read(again, 512) == b"\4" * 512
    assert device.read(first, 512) == b"\1" * 512 and device.read(third, 512) == b"\3" * 512
    device.free(first)
    device.free(third)
    device.free(again)
    fresh = device.upload(b"\5" * 1024, at=first)  # the granule's memory, all of it given back
    assert device.read(fresh, 1024) == b"\5" * 1024


def test_an_address_where_nothing_is_mapped_is_refused(device):
    nowhere = device.arena.base + device.arena.size - 4 * MIB
    with pytest.raises(CudaError) as caught:
        device.write(nowhere, b"\0" * 16)
    assert caught.value.code == CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CudaError) as caught:
        device.read(nowhere, 16)
    assert caught.value.code == CUDA_ERROR_INVALID_VALUE


def test_device_to_device_copies(device):
    data = os.urandom(3 * MIB)
    source = device.upload(data)
    target = device.upload(bytes(3 * MIB))
    with device.backend.running():
        device.backend.copy(target + 1, source + 2, len(data) - 10)
        device.backend.synchronize()
    assert device.read(target, len(data)) == b"\0" + data[2:-8] + bytes(9)


@pytest.mark.parametrize("pattern", [b"\x5a", b"\x34\x12", b"\x78\x56\x34\x12"],
                         ids=["8bit", "16bit", "32bit"])
def test_fills_write_their_pattern_and_nothing_beside(device, pattern):
    size = 3 * MIB
    address = device.upload(b"\xff" * size)
    count = (size - 2 * len(pattern) * 3) // len(pattern)
    start = address + len(pattern) * 3
    with device.backend.running():
        device.backend.fill(start, pattern, count)
        device.backend.synchronize()
    expected = b"\xff" * (3 * len(pattern)) + pattern * count
    expected += b"\xff" * (size - len(expected))
    assert device.read(address, size) == expected


def test_a_host_view_where_there_is_one_is_the_memory(device):
    address = device.upload(b"\1" * 4096)
    with device.backend.running():
        view = device.backend.host_view(address, 4096)
    if view is None:
        assert not device.backend.memory_is_host_ram  # such a backend must give its views
        return
    view[:4] = b"abcd"
    assert device.read(address, 8) == b"abcd\1\1\1\1"
    device.write(address + 4, b"efgh")
    assert bytes(view[:8]) == b"abcdefgh"


def test_what_changed_since_a_mark_covers_every_write(device):
    """A backend may name more than changed, or nothing (None: it cannot tell), never less."""
    a, b, c = (device.upload(bytes(8192)) for _ in range(3))
    with device.backend.running():
        mark = device.backend.mark()
        device.backend.write(a + 100, memoryview(b"x" * 50))
        device.backend.fill(b, b"\7", 300)
        device.backend.copy(c + 8000, a, 100)
        device.backend.synchronize()
        changed = device.backend.changed_since(mark)
    if changed is None:
        return
    for start, size in ((a + 100, 50), (b, 300), (c + 8000, 100)):
        assert any(s <= start and start + size <= s + n for s, n in changed), (start, changed)


# ----------------------------------------------------------------- modules and launches

@pytest.mark.parametrize("image", ["ptx", "fatbin"])
def test_a_module_describes_its_kernels_parameters(device, kernels, image):
    module = device.load(getattr(kernels, image))
    axpb = module.kernels["axpb"]
    assert axpb.param_offsets == [0, 8, 16, 20, 24]
    assert axpb.param_sizes == [8, 8, 4, 4, 8]
    assert axpb.param_buffer_size == 32
    assert axpb.attributes["max_threads_per_block"] >= 256
    assert module.kernels["say"].uses_printf and not axpb.uses_printf
    assert {"axpb", "count_up", "scaled", "follow", "store_at", "insist"} <= module.kernels.keys()


@pytest.mark.parametrize("image", ["ptx", "fatbin"])
def test_a_kernel_runs_with_its_parameter_buffer(device, kernels, image):
    module = device.load(getattr(kernels, image))
    n = 1000
    x = [i * 0.25 for i in range(n)]
    source = device.upload(as_floats(x))
    result = device.upload(bytes(4 * n))
    device.launch(module, "axpb", 4, 256, ptr(result), ptr(source), f32(3.0), i32(n), f64(1.5))
    assert floats(device.read(result, 4 * n)) == [3.0 * v + 1.5 for v in x]


def test_module_variables_hold_their_initial_values_and_kernels_see_writes(device, kernels):
    module = device.load(kernels.ptx)
    counter, size = module.variables["counter"]
    assert size == 4 and device.read(counter, 4) == i32(1000)
    scale, size = module.variables["scale"]
    assert size == 8 and floats(device.read(scale, 8)) == [2.0, 0.5]
    device.launch(module, "count_up", 1, 32, i32(5))
    assert device.read(counter, 4) == i32(1005)
    device.write(scale, as_floats([10.0, 1.0]))  # as cuMemcpyHtoD to a __constant__ does
    values = device.upload(as_floats([1.0, 2.0, 3.0]))
    out = device.upload(bytes(12))
    device.launch(module, "scaled", 1, 32, ptr(out), ptr(values), i32(3))
    assert floats(device.read(out, 12)) == [11.0, 21.0, 31.0]


def test_two_modules_have_variables_of_their_own(device, kernels):
    first, second = device.load(kernels.ptx), device.load(kernels.ptx)
    device.launch(first, "count_up", 1, 1, i32(7))
    assert device.read(first.variables["counter"][0], 4) == i32(1007)
    assert device.read(second.variables["counter"][0], 4) == i32(1000)
    with device.backend.running():
        device.backend.unload_module(first)
    device.launch(second, "count_up", 1, 1, i32(1))
    assert device.read(second.variables["counter"][0], 4) == i32(1001)


def test_a_launch_beyond_the_devices_limits_is_invalid(device, kernels):
    module = device.load(kernels.ptx)
    for block, shared in ((4096, 0), (32, 1 << 30)):
        with pytest.raises(CudaError) as caught:
            device.launch(module, "count_up", 1, block, i32(1), shared=shared)
        assert caught.value.code == CUDA_ERROR_INVALID_VALUE, (block, shared)


def test_device_printf_comes_back_with_the_launch(device, kernels):
    module = device.load(kernels.ptx)
    output, _ = device.launch(module, "say", 2, 2, i32(42))
    lines = sorted(output.splitlines())
    assert lines == [f"block {b} thread {t} value 42" for b in range(2) for t in range(2)]


def test_a_failed_assert_is_a_fault_with_cudas_code_and_its_report(device, kernels):
    module = device.load(kernels.ptx)
    device.launch(module, "insist", 1, 1, i32(0))  # holds: nothing happens
    with pytest.raises(KernelFault) as caught:
        device.launch(module, "insist", 1, 1, i32(3))
    fault = caught.value
    assert fault.code == CUDA_ERROR_ASSERT
    assert "before the assert 3" in fault.output
    assert "Assertion" in fault.diagnostics and "value == 0" in fault.diagnostics


def test_a_kernel_storing_where_nothing_is_mapped_faults_with_an_illegal_address(device,
                                                                                kernels):
    module = device.load(kernels.ptx)
    target = device.upload(bytes(4))
    device.launch(module, "store_at", 1, 1, ptr(target), i32(9))
    assert device.read(target, 4) == i32(9)
    nowhere = device.arena.base + device.arena.size - 4 * MIB
    # From the launcher (a KernelFault), or from the synchronization after it where the
    # launch was queued, as on a GPU: the session makes either code sticky.
    with pytest.raises(CudaError) as caught:
        device.launch(module, "store_at", 1, 1, ptr(nowhere), i32(9))
    assert caught.value.code == CUDA_ERROR_ILLEGAL_ADDRESS


def test_after_a_fault_and_a_recovery_new_work_runs(device, kernels):
    """What a device reset (cuDevicePrimaryCtxReset) asks of the backend after a sticky
    fault: the session has freed the context's memory and modules, and starts afresh."""
    module = device.load(kernels.ptx)
    nowhere = device.arena.base + device.arena.size - 4 * MIB
    with pytest.raises(CudaError):
        device.launch(module, "store_at", 1, 1, ptr(nowhere), i32(9))
    with device.backend.running():
        device.backend.unload_module(module)
    for address, _ in device.arena.allocations():
        if address in module.places:  # the module's variables went with it
            device.arena.free(address)
        else:
            device.free(address)
    with device.backend.running():
        device.backend.recover()
    module = device.load(kernels.ptx)
    target = device.upload(bytes(4))
    device.launch(module, "store_at", 1, 1, ptr(target), i32(5))
    assert device.read(target, 4) == i32(5)


def test_after_cancel_no_kernel_runs(device, kernels):
    """cancel() comes from another thread than the one running kernels: a session ending."""
    module = device.load(kernels.ptx)
    target = device.upload(bytes(4))
    canceller = threading.Thread(target=device.backend.cancel)
    canceller.start()
    canceller.join()
    with pytest.raises(Cancelled):
        device.launch(module, "store_at", 1, 1, ptr(target), i32(9))


# ----------------------------------------------------------------- host memory (zero copy)

@contextlib.contextmanager
def host_buffer(size: int):
    """A memory file mapped shared in this process, as a session maps a client's page-locked
    buffer: (its bytes, their address, the file's descriptor). The descriptor stays open
    meanwhile, as the session's does (a driver that is vgpu's own shares the file through
    it, a backend in a device process maps the file by it)."""
    fd = sealed_file("contract-host", size)
    mapping = mmap.mmap(fd, size)
    address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))  # no export is kept
    try:
        yield mapping, address, fd
    finally:
        mapping.close()
        os.close(fd)


def test_kernels_and_copies_reach_a_host_buffer_shown_at_its_own_address(device, kernels):
    """Zero copy: a buffer shown to the device where it is in the process (a session maps a
    client's there) is memory that kernels use through that address, before and after a
    recovery from a fault, and that copies reach."""
    module = device.load(kernels.ptx)
    with host_buffer(8192) as (buffer, address, fd):
        view = memoryview(buffer)
        try:
            with device.backend.running():
                assert device.backend.map_host(address, 8192, view, fd) is None
            device.launch(module, "store_at", 1, 1, ptr(address + 4096), i32(77))
            assert buffer[4096:4100] == i32(77)
            buffer[8:12] = b"abcd"
            assert device.read(address + 8, 4) == b"abcd"
            device.write(address + 16, b"wxyz")
            assert buffer[16:20] == b"wxyz"
            nowhere = device.arena.base + device.arena.size - 4 * MIB
            with pytest.raises(CudaError):
                device.launch(module, "store_at", 1, 1, ptr(nowhere), i32(9))
            with device.backend.running():
                device.backend.unload_module(module)
            for place in module.places:
                device.arena.free(place)
            with device.backend.running():
                device.backend.recover()
            module = device.load(kernels.ptx)
            device.launch(module, "store_at", 1, 1, ptr(address + 4100), i32(78))
            assert buffer[4096:4104] == i32(77) + i32(78)
            with device.backend.running():
                device.backend.unmap(address)
        finally:
            view.release()


def test_a_host_buffer_shown_elsewhere_serves_copies(device, kernels):
    """Where the session could not map a client's buffer at the client's address, the
    backend is shown it at an address where it is not in this process: copies reach it,
    and kernels too unless the backend says why not (its device needs host addresses, and
    the buffer is not at that address in the process that drives the device)."""
    with host_buffer(4096) as (buffer, address, fd):
        elsewhere = 0x6000_0000_0000 + address % (1 << 40) // 4096 * 4096
        view = memoryview(buffer)
        try:
            with device.backend.running():
                unreached = device.backend.map_host(elsewhere, 4096, view, fd)
            device.write(elsewhere + 4, b"wxyz")
            assert buffer[4:8] == b"wxyz"
            if unreached is None:
                module = device.load(kernels.ptx)
                device.launch(module, "store_at", 1, 1, ptr(elsewhere + 8), i32(5))
                assert buffer[8:12] == i32(5)
            else:
                assert "not free in the server's process" in unreached
            with device.backend.running():
                device.backend.unmap(elsewhere)
        finally:
            view.release()


# ----------------------------------------------------------------- physical memory (VMM)

def test_physical_memory_shows_the_same_bytes_wherever_it_is_mapped(device):
    backend = device.backend
    size = 2 * MIB
    first = device.arena.reserve(size, size)
    second = device.arena.reserve(size, size)
    with backend.running():
        physical = backend.create_physical(size)
        backend.map_physical(first, size, physical)
        backend.map_physical(second, size, physical)
        backend.set_access(first, READ_WRITE)
        backend.set_access(second, READ_WRITE)
    assert device.read(first, 4096) == bytes(4096)  # fresh physical memory is zeros
    data = os.urandom(4096)
    device.write(first + 8192, data)
    assert device.read(second + 8192, 4096) == data
    out = bytearray(4096)
    with backend.running():
        backend.read_physical(physical, 8192, memoryview(out))
        backend.write_physical(physical, 0, memoryview(b"written"))
    assert out == data and device.read(second, 7) == b"written"
    with backend.running():
        backend.unmap(first)
        backend.unmap(second)
        backend.release_physical(physical)


def test_physical_memory_made_with_contents_holds_them(device):
    size = 2 * MIB
    contents = bytearray(os.urandom(size))
    address = device.arena.reserve(size, size)
    with device.backend.running():
        physical = device.backend.create_physical(size, bytearray(contents))
        device.backend.map_physical(address, size, physical)
        device.backend.set_access(address, READ)
    assert device.read(address, size) == contents


def test_physical_memory_written_at_an_offset_shows_there_in_its_mapping(device):
    """A restore writes physical memory piece by piece; a mapping (from the start, as CUDA
    maps) shows each piece at its own offset."""
    size = 2 * MIB
    address = device.arena.reserve(2 * size, size)
    with device.backend.running():
        physical = device.backend.create_physical(2 * size)
        device.backend.write_physical(physical, size, memoryview(b"second half"))
        device.backend.map_physical(address, 2 * size, physical)
        device.backend.set_access(address, READ_WRITE)
    assert device.read(address + size, 11) == b"second half"
    assert device.read(address, 11) == bytes(11)


def test_physical_memory_without_access_is_not_read(device):
    size = 2 * MIB
    address = device.arena.reserve(size, size)
    with device.backend.running():
        physical = device.backend.create_physical(size)
        device.backend.map_physical(address, size, physical)
    with pytest.raises(CudaError):
        device.read(address, 16)


# ----------------------------------------------------------------- contents that move

PAIRS = [(a, b) for a in KINDS for b in KINDS]


@pytest.mark.parametrize("source,target", PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_contents_taken_from_one_backend_run_on_a_fresh_one_at_the_same_addresses(
        make_device, kernels, source, target):
    """What a checkpoint takes (the bytes of every arena allocation, module variables'
    places among them) put back on a fresh backend (the first one closed, its addresses
    given back), the module loaded again at its places: pointers stored in device memory
    still lead to the right data, and module variables keep their values."""
    before = make_device(source)
    module = before.load(kernels.ptx)
    before.launch(module, "count_up", 1, 1, i32(11))
    places = module.places
    assert sorted(address for address, _ in module.variables.values()) == sorted(places)
    values = [before.upload(struct.pack("<q", 1000 + i) + os.urandom(600)) for i in range(5)]
    table = before.upload(b"".join(ptr(v) for v in values))
    big = before.upload(os.urandom(3 * MIB))
    regions = before.arena.allocations()
    taken = {address: before.read(address, size) for address, size in regions}
    before.close()

    after = make_device(target)
    for address, size in regions:  # the journal's allocations (the module's places apart)
        if address not in places:
            after.alloc(size, at=address)
    module = after.load(kernels.ptx, places=places)
    assert module.places == places
    for address, data in taken.items():
        after.write(address, data)
    out = after.upload(bytes(8 * len(values)))
    after.launch(module, "follow", 1, 32, ptr(out), ptr(table), i32(len(values)))
    assert struct.unpack("<5q", after.read(out, 40)) == tuple(range(1000, 1005))
    assert after.read(big, 3 * MIB) == taken[big]
    after.launch(module, "count_up", 1, 1, i32(1))
    assert after.read(module.variables["counter"][0], 4) == i32(1012)


# ----------------------------------------------------------------- events

def test_an_event_completes_after_the_work_before_it_and_times_it(device, kernels):
    module = device.load(kernels.ptx)
    target = device.upload(bytes(4))
    backend = device.backend
    with backend.running():
        start, end, never = (backend.create_event(0, True) for _ in range(3))
        backend.record_event(start, 0)
    device.launch(module, "store_at", 1, 1, ptr(target), i32(31))
    with backend.running():
        backend.record_event(end, 0)
        backend.synchronize_event(end)
        assert backend.event_done(start) and backend.event_done(end)
        assert backend.event_done(never)  # never recorded: complete, as on CUDA
        assert 0.0 <= backend.elapsed_ms(start, end) < 60_000.0
        with pytest.raises(CudaError) as caught:
            backend.elapsed_ms(start, never)
        assert caught.value.code == CUDA_ERROR_INVALID_HANDLE
        for event in (start, end, never):
            backend.destroy_event(event)
    assert device.read(target, 4) == i32(31)


@pytest.mark.parametrize("source,target", PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_a_restored_event_times_from_when_its_record_completed(make_device, source, target):
    """What a checkpoint keeps of an event (its age), given back by a restore on a fresh
    backend: elapsed times count from the first record (here 2 s further back)."""
    before = make_device(source)
    taken = before.backend
    with taken.running():
        event = taken.create_event(0, True)
        taken.record_event(event, 0)
        taken.synchronize_event(event)
        age = taken.event_age(event)
    before.close()  # its addresses given back
    assert 0.0 <= age < 60.0
    backend = make_device(target).backend
    with backend.running():
        restored, later = backend.create_event(0, True), backend.create_event(0, True)
        backend.backdate_event(restored, age + 2.0)
        backend.record_event(later, 0)
        backend.synchronize_event(later)
        assert backend.event_done(restored)
        assert 2000.0 <= backend.elapsed_ms(restored, later) < 2000.0 + 60_000.0
        assert backend.event_age(restored) >= age + 2.0


@pytest.mark.parametrize("kind", ["cuda", "cuda-process"])
def test_a_stream_waits_on_the_device_for_an_event_of_another(device, kernels):
    """Backends that run streams themselves: an event recorded behind a kernel that is
    held (spinning on a host flag) is not complete, and a kernel on another stream queued
    after a wait for it runs only once the held one finished; neither call waits."""
    module = device.load(kernels.ptx)
    target = device.upload(bytes(8))
    backend = device.backend
    with host_buffer(4096) as (buffer, flag, fd):
        view = memoryview(buffer)
        try:
            with backend.running():
                assert backend.map_host(flag, 4096, view, fd) is None
                held, behind = 7001, 7002
                backend.stream_created(held)
                backend.stream_created(behind)
                event = backend.create_event(0, False)
                copy = backend.prepare_launch(module, "copy_int", (1, 1, 1), (1, 1, 1), 0)
                copy(pack(module, "copy_int", (ptr(target), ptr(target + 4))), 0, behind)
                backend.synchronize()  # (the copy's first launch, which may be slower)
                spin = backend.prepare_launch(module, "store_after_flag", (1, 1, 1),
                                              (1, 1, 1), 0)
                spin(pack(module, "store_after_flag", (ptr(flag), ptr(target), i32(5))),
                     0, held)
                backend.record_event(event, held)
                assert not backend.event_done(event)
                backend.wait_event(behind, event)
                copied = backend.create_event(0, False)
                copy(pack(module, "copy_int", (ptr(target), ptr(target + 4))), 0, behind)
                backend.record_event(copied, behind)
                # Queries reach the device (a driver that queues calls, as vgpu's does,
                # sends them): a copy that did not wait would have run by the last.
                for _ in range(QUERIES):
                    assert not backend.event_done(copied)
                buffer[0:4] = i32(2)  # the held kernel may finish now
                backend.synchronize_event(copied)
                assert backend.event_done(event)
                backend.synchronize()
                backend.destroy_event(event)
                backend.destroy_event(copied)
                backend.stream_destroyed(held)
                backend.stream_destroyed(behind)
                backend.unmap(flag)
        finally:
            view.release()
    assert device.read(target, 8) == i32(7) + i32(7)
