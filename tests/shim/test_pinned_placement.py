"""Page-locked allocations where the server cannot show them to kernels at their address (a
cuda-backend server whose process holds that address already): the client tries other
addresses, and past a few keeps the memory for copies only, or refuses a device-mapped
allocation saying why; registered memory is kept for copies only, or refused when
registered device-mapped. The server is a stand-in that answers vgpuMapHostSegment as such a
server does, for the first addresses it is offered."""

from __future__ import annotations

import ctypes

import pytest

from vgpu.errors import CudaError
from vgpu.shim.driver import memory
from vgpu.shim.driver._state import HostAllocation, state
from vgpu.shim.driver.hostmem import is_mapped, map_anonymous, unmap

CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_SUPPORTED = 801
REASON = "the client's address is not free in the server's process"


class Server:
    """Answers the first `refusals` host segments with why kernels do not reach them."""

    shares_host_memory = True

    def __init__(self, refusals: int):
        self.refusals = refusals
        self.mapped: dict[int, int] = {}  # segment -> address

    def call(self, op: str, *args):
        if op == "vgpuMapHostSegment":
            segment, _, _, address = args
            self.mapped[segment] = address
            self.refusals -= 1
            return (REASON if self.refusals >= 0 else None), []
        assert op == "vgpuUnmapHostSegment"
        del self.mapped[args[0]]
        return None, []


@pytest.fixture
def server(monkeypatch):
    allocations = {}

    def connect(refusals: int) -> Server:
        stand_in = Server(refusals)
        monkeypatch.setattr(state, "conn", lambda: stand_in)
        monkeypatch.setattr(state, "current_context", lambda: 1)
        monkeypatch.setattr(state, "host_allocations", allocations)
        return stand_in
    yield connect
    for address, allocation in allocations.items():
        unmap(address, allocation.size)


def test_an_allocation_the_device_cannot_see_is_placed_again(server):
    stand_in = server(refusals=2)
    address = memory._host_alloc(5000, memory.CU_MEMHOSTALLOC_DEVICEMAP)
    assert list(stand_in.mapped.values()) == [address]  # the refused ones given back
    assert state.host_allocations[address].device_pointer == address
    assert memory._host_device_pointer(address) == address


def test_past_a_few_tries_memory_serves_copies_only_or_is_refused_when_mapped(server):
    stand_in = server(refusals=100)
    address = memory._host_alloc(5000, 0)
    assert list(stand_in.mapped.values()) == [address]
    assert state.host_allocations[address].device_pointer is None
    with pytest.raises(CudaError) as refused:
        memory._host_device_pointer(address)
    assert refused.value.code == 1  # CUDA_ERROR_INVALID_VALUE, as for pageable memory

    with pytest.raises(CudaError) as refused:
        memory._host_alloc(5000, memory.CU_MEMHOSTALLOC_DEVICEMAP)
    assert refused.value.code == CUDA_ERROR_OUT_OF_MEMORY and REASON in refused.value.message
    assert list(stand_in.mapped.values()) == [address]  # none of the tries kept
    assert is_mapped(address, 5000)


def _private(address: int) -> bool:
    """Whether the page at `address` is private anonymous memory again."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= address < high:
                return fields[1] == "rw-p" and len(fields) == 5
    return False


def test_registered_memory_the_device_cannot_see_serves_copies_or_is_refused(server):
    stand_in = server(refusals=100)
    pages = map_anonymous(3 * 4096)
    try:
        ctypes.memset(pages, 7, 3 * 4096)
        plain = HostAllocation(4096, memory._REGISTERED, None)
        assert memory._share_registered(pages, plain)
        assert plain.device_pointer is None and plain.segment in stand_in.mapped
        mapped = HostAllocation(4096, memory._REGISTERED | memory.CU_MEMHOSTREGISTER_DEVICEMAP,
                                None)
        with pytest.raises(CudaError) as refused:
            memory._share_registered(pages + 2 * 4096, mapped)
        assert refused.value.code == CUDA_ERROR_NOT_SUPPORTED
        assert REASON in refused.value.message
        assert len(stand_in.mapped) == 1 and _private(pages + 2 * 4096)
        assert ctypes.string_at(pages + 2 * 4096, 4) == b"\7" * 4  # contents kept
    finally:
        unmap(pages, 3 * 4096)
