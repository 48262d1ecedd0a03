"""Which memory file a host range is mapped from (hostmem.shared_file_at): what vgpu's
cuMemHostRegister shares with its server for pages that are another process's shared
buffer already (a cuda-backend server registers its clients' pinned buffers so)."""

from __future__ import annotations

import os

from vgpu.shim.driver.hostmem import map_anonymous, map_shared, shared_file_at, unmap

SIZE = 10_000  # not a whole number of pages, as a pinned allocation's file need not be


def test_a_range_in_a_memory_file_held_open_names_that_file():
    address, fd = map_shared(SIZE)
    try:
        assert shared_file_at(address, address + 100) == (fd, SIZE, address)
        assert shared_file_at(address + 8192, address + 12288) == (fd, SIZE, address)
        assert shared_file_at(address, address + 12289) is None  # past the file's pages
        os.close(fd)
        fd = -1
        assert shared_file_at(address, address + 100) is None  # no descriptor to share
    finally:
        if fd >= 0:
            os.close(fd)
        unmap(address, SIZE)


def test_private_memory_is_no_shared_file():
    address = map_anonymous(4096)
    try:
        assert shared_file_at(address, address + 10) is None
    finally:
        unmap(address, 4096)
