"""DeviceMemory: the emu backend's sparse device memory."""

from __future__ import annotations

import mmap
import sys
import threading

import numpy as np
import pytest

from vgpu.server.emu import DeviceMemory, IllegalAddress
from vgpu.server.emu.memory import NO_ACCESS, READ, READ_WRITE

BASE = 0x7F00_0000_0000


@pytest.fixture
def memory() -> DeviceMemory:
    m = DeviceMemory()
    m.map(BASE, 4096)
    m.map(BASE + 8192, 256)
    return m


def test_new_allocations_are_zero_filled(memory):
    assert memory.read(BASE, 16) == bytes(16)


def test_read_write_roundtrip(memory):
    memory.write(BASE + 10, b"hello")
    assert memory.read(BASE + 8, 9) == b"\0\0hello\0\0"
    memory.write(BASE + 100, memoryview(np.arange(4, dtype=np.uint32)))
    assert np.frombuffer(memory.read(BASE + 100, 16), np.uint32).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("address,size", [(BASE - 1, 1), (BASE + 4095, 2), (BASE + 4096, 1),
                                          (BASE + 4000, 8192), (0, 4), (BASE + 8192 + 250, 7)])
def test_accesses_must_lie_inside_one_allocation(memory, address, size):
    with pytest.raises(IllegalAddress) as info:
        memory.read(address, size)
    assert (info.value.address, info.value.size) == (address, size)
    with pytest.raises(IllegalAddress):
        memory.write(address, bytes(size))
    with pytest.raises(IllegalAddress):
        memory.view(address, size)


def test_view_is_zero_copy_and_writable(memory):
    view = memory.view(BASE + 64, 8)
    view[:] = b"ABCDEFGH"
    assert memory.read(BASE + 64, 8) == b"ABCDEFGH"


@pytest.mark.parametrize("pattern", [b"\xab", b"\x01\x02", b"\x01\x02\x03\x04"])
def test_fill(memory, pattern):
    memory.fill(BASE + 4, pattern, 10)
    assert memory.read(BASE + 4, 10 * len(pattern)) == pattern * 10
    assert memory.read(BASE, 4) == bytes(4)
    assert memory.read(BASE + 4 + 10 * len(pattern), 4) == bytes(4)


def test_fill_checks_bounds_and_pattern(memory):
    with pytest.raises(IllegalAddress):
        memory.fill(BASE + 4000, b"\0\0\0\0", 100)
    with pytest.raises(ValueError):
        memory.fill(BASE, b"\0\0\0", 1)


def test_copy_within_and_between_allocations(memory):
    memory.write(BASE, bytes(range(32)))
    memory.copy(BASE + 8192, BASE, 32)
    assert memory.read(BASE + 8192, 32) == bytes(range(32))
    memory.copy(BASE + 4, BASE, 16)   # overlapping
    assert memory.read(BASE + 4, 16) == bytes(range(16))
    with pytest.raises(IllegalAddress):
        memory.copy(BASE + 8192, BASE, 300)


def test_find(memory):
    assert memory.find(BASE) == (BASE, 4096)
    assert memory.find(BASE + 4095) == (BASE, 4096)
    assert memory.find(BASE + 4096) is None
    assert memory.find(BASE + 8200) == (BASE + 8192, 256)


def test_map_rejects_overlaps_and_windows(memory):
    with pytest.raises(ValueError):
        memory.map(BASE + 4000, 200)
    with pytest.raises(ValueError):
        memory.map(BASE - 100, 200)
    with pytest.raises(ValueError):
        memory.map(0xF000_0000_0000_0000, 16)
    with pytest.raises(ValueError):
        memory.map(BASE + 100_000, 0)


def test_unmap(memory):
    memory.unmap(BASE)
    assert memory.find(BASE) is None
    with pytest.raises(IllegalAddress):
        memory.read(BASE, 1)
    with pytest.raises(IllegalAddress):
        memory.unmap(BASE)
    memory.map(BASE, 16)
    assert memory.read(BASE, 16) == bytes(16)


def test_backing_buffer_is_shared():
    segment = mmap.mmap(-1, 4096)
    memory = DeviceMemory()
    memory.map(BASE, 4096, backing=memoryview(segment))
    memory.write(BASE + 1, b"xyz")
    assert segment[1:4] == b"xyz"
    segment[100:102] = b"ok"
    assert memory.read(BASE + 100, 2) == b"ok"
    with pytest.raises(ValueError):
        memory.map(BASE + 8192, 16, backing=memoryview(b"read-only buffer"))


def test_gather_scatter_fast_path_and_across_allocations(memory):
    memory.write(BASE, np.arange(1024, dtype=np.uint32).tobytes())
    addrs = BASE + 4 * np.array([5, 0, 1023, 7], np.uint64)
    assert memory.gather(addrs, np.uint32).tolist() == [5, 0, 1023, 7]
    memory.write(BASE + 8192, np.arange(64, dtype=np.uint32).tobytes() * 1)
    mixed = np.array([BASE + 8, BASE + 8192 + 12, BASE + 16], np.uint64)
    assert memory.gather(mixed, np.uint32).tolist() == [2, 3, 4]
    memory.scatter(mixed, np.array([70, 80, 90], np.uint32))
    assert memory.gather(mixed, np.uint32).tolist() == [70, 80, 90]
    pairs = memory.gather(np.array([BASE, BASE + 8192], np.uint64), np.uint32, count=2)
    assert pairs.tolist() == [[0, 1], [0, 1]]


def test_gather_unaligned_and_out_of_bounds_lanes(memory):
    memory.write(BASE, bytes(range(64)))
    got = memory.gather(np.array([BASE + 1, BASE + 3], np.uint64), np.uint16)
    assert got.tolist() == [0x0201, 0x0403]
    with pytest.raises(IllegalAddress) as info:
        memory.gather(np.array([BASE, BASE + 4094, BASE + 8], np.uint64), np.uint32)
    assert info.value.index == 1 and info.value.address == BASE + 4094
    with pytest.raises(IllegalAddress) as info:
        memory.scatter(np.array([BASE, BASE + 5000], np.uint64), np.zeros(2, np.uint32))
    assert info.value.index == 1


def test_granules_map_the_padding_after_an_allocation():
    memory = DeviceMemory(granule=512)
    memory.map(BASE, 100)
    lanes = np.array([BASE, BASE + 96, BASE + 100, BASE + 508], np.uint64)
    with pytest.raises(IllegalAddress) as info:  # no stray handler: strict
        list(memory.segments(lanes, 4))
    assert info.value.index == 2
    strays = []
    segments = list(memory.segments(lanes, 4, strays.append))
    assert strays == [2]  # the first lane past the end, once
    assert [s[0].size for s in segments] == [512]
    with pytest.raises(IllegalAddress) as info:  # past the granule: a fault either way
        list(memory.segments(np.array([BASE, BASE + 512], np.uint64), 4, strays.append))
    assert info.value.index == 1
    with pytest.raises(IllegalAddress):  # copies and memsets keep to the allocation
        memory.read(BASE + 96, 8)
    assert memory.find(BASE + 100) is None and memory.allocations() == [(BASE, 100)]


def test_an_allocation_inside_a_granule_takes_its_bytes_back():
    memory = DeviceMemory(granule=512)
    memory.map(BASE, 100)
    memory.map(BASE + 256, 16)
    memory.write(BASE + 256, b"x" * 16)
    assert memory.gather(np.array([BASE + 256], np.uint64), np.uint8).tolist() == [120]
    strays = []
    (array, offsets, _), = memory.segments(np.array([BASE + 252], np.uint64), 4,
                                           strays.append)
    assert strays == [0] and array.size == 256 and offsets.tolist() == [252]


def test_one_buffer_at_two_addresses_shows_the_same_bytes():
    physical = bytearray(8192)
    memory = DeviceMemory()
    memory.map(BASE, 4096, memoryview(physical)[4096:])
    memory.map(BASE + 65536, 8192, memoryview(physical))
    memory.write(BASE + 8, b"alias")
    assert memory.read(BASE + 65536 + 4096 + 8, 5) == b"alias" and physical[4104:4109] == b"alias"
    memory.scatter(np.array([BASE + 65536 + 4096], np.uint64), np.array([7], np.uint32))
    assert memory.gather(np.array([BASE], np.uint64), np.uint32).tolist() == [7]


def test_access_a_mapping_does_not_allow_is_refused():
    memory = DeviceMemory()
    memory.map(BASE, 4096, access=NO_ACCESS)
    memory.map(BASE + 8192, 4096)
    with pytest.raises(IllegalAddress, match="without access") as info:
        memory.read(BASE, 4)
    assert info.value.denied
    with pytest.raises(IllegalAddress, match="without access") as info:  # lane 1 of 2
        memory.gather(np.array([BASE + 8192, BASE + 4], np.uint64), np.uint32)
    assert info.value.index == 1
    memory.set_access(BASE, READ)
    assert memory.read(BASE, 4) == bytes(4)
    assert memory.gather(np.array([BASE, BASE + 8192], np.uint64), np.uint32).tolist() == [0, 0]
    for write in (lambda: memory.write(BASE, b"x"), lambda: memory.fill(BASE, b"x", 1),
                  lambda: memory.copy(BASE, BASE + 8192, 4), lambda: memory.view(BASE, 4),
                  lambda: memory.scatter(np.array([BASE], np.uint64), np.zeros(1, np.uint32))):
        with pytest.raises(IllegalAddress, match="read-only"):
            write()
    memory.copy(BASE + 8192, BASE, 4)  # reading it is allowed
    memory.view(BASE, 4, writing=False)
    memory.set_access(BASE, READ_WRITE)
    memory.write(BASE, b"now")
    assert memory.read(BASE, 3) == b"now"


def test_a_chunk_of_blocks_holds_a_bounded_amount_of_shared_memory():
    """Blocks run together in chunks; each block's shared memory counts toward a chunk's
    bound, so many small blocks with the most shared memory do not take gigabytes at once."""
    from vgpu.server.emu import PtxModule, prepare
    from vgpu.server.emu.executor import CHUNK_STATE_BYTES

    module = PtxModule.parse("""
.version 9.0
.target sm_80
.address_size 64
.extern .shared .align 16 .b8 dyn[];
.visible .entry touch()
{
    .reg .b32 %r<2>;
    mov.u32 %r1, 1;
    st.shared.u32 [dyn], %r1;
    ret;
}
""")
    shared = 200 << 10
    prepared = prepare(module, "touch", (65536, 1, 1), (1, 1, 1), shared)
    sizes = {chunk.nblocks for chunk in prepared._chunks()}
    assert max(sizes) * shared <= CHUNK_STATE_BYTES
    assert sum(chunk.nblocks for chunk in prepared._chunks()) == 65536


def _kernels_until(memory: DeviceMemory, done: threading.Event) -> None:
    """What kernels on a stream's thread ask of the memory, until `done`."""
    while not done.is_set():
        memory.native_table()
        memory.gather(np.array([0x10000, 0x20000], np.uint64), np.uint8)


def test_tables_made_while_another_thread_maps_memory_show_every_allocation_after():
    """Kernels on the streams' threads make the allocation table (and the lanes' index) while
    the session's thread maps memory: whatever they made meanwhile, the next kernel's table
    has every allocation, each at its own host memory."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns between a few bytecodes
    try:
        for _ in range(20):
            memory = DeviceMemory(granule=512)
            for k in range(40):
                memory.map(0x10000 + k * 0x1000, 256)
            done = threading.Event()
            reader = threading.Thread(target=_kernels_until, args=(memory, done))
            reader.start()
            try:
                for k in range(40, 50):
                    memory.map(0x10000 + k * 0x1000, 256)
            finally:
                done.set()
                reader.join()
            table = memory.native_table()
            assert [tuple(row[:2]) for row in table] == memory.allocations()
            for (base, size), row in zip(memory.allocations(), table, strict=True):
                assert row[3] == np.frombuffer(memory.view(base, size), np.uint8).ctypes.data
    finally:
        sys.setswitchinterval(switch)
