"""The device heap behind kernels' malloc/free (and C++ new/delete, which nvcc lowers to them).

The heap is one device allocation of cudaLimitMallocHeapSize bytes that the backend gives
the launch. Its bookkeeping lives inside it, in device memory, so the heap needs no state of
its own anywhere else: a checkpoint, restore or migration that carries the allocation's
contents carries every block malloc handed out, and a pointer malloc'd by one kernel can be
freed by a later one (as CUDA allows).

Layout: the first 16 bytes hold the offset of the first byte never handed out ("top"; 0 in
a fresh heap, which reads as 16). Below top, blocks follow one another, each a 16-byte
header (u64 payload size, a multiple of 16; u64 1 when in use, 0 when free) and its
payload, so every pointer malloc returns is 16-byte aligned. malloc takes the first free
block that fits (free neighbours merge as they are found, a block much larger than asked
for is split), else carves a new block at top; when neither fits it returns NULL, as
CUDA's does when the heap is exhausted. Requests are served in lane order, so a launch
hands out the same addresses every time it runs.
"""

from __future__ import annotations

import struct

from .errors import CUDA_ERROR_ILLEGAL_ADDRESS
from .state import Fault

__all__ = ["DeviceHeap"]

HEADER = 16
_FRESH_TOP = HEADER  # the first block starts after the heap's own header
_HEADER = struct.Struct("<QQ")
_TOP = struct.Struct("<Q")


class DeviceHeap:
    """malloc/free over the heap allocation at `base` (`size` bytes) of `memory`."""

    def __init__(self, memory, base: int, size: int):
        self.memory = memory
        self.base = base
        self.size = size

    def _blocks(self) -> tuple[int, list[list[int]]]:
        """(top, [[offset, payload size, in use], ...]) with free neighbours merged."""
        top = _TOP.unpack(self.memory.read(self.base, 8))[0] or _FRESH_TOP
        data = self.memory.view(self.base, top, False)
        blocks: list[list[int]] = []
        offset = _FRESH_TOP
        while offset < top:
            payload, used = _HEADER.unpack_from(data, offset)
            if blocks and not used and not blocks[-1][2]:
                blocks[-1][1] += HEADER + payload
            else:
                blocks.append([offset, payload, used])
            offset += HEADER + payload
        return top, blocks

    def _write(self, top: int, blocks) -> None:
        """Write `top` and the headers of `blocks` (through one view of the heap)."""
        view = self.memory.view(self.base, max((b[0] + HEADER for b in blocks), default=8))
        _TOP.pack_into(view, 0, top)
        for offset, payload, used in blocks:
            _HEADER.pack_into(view, offset, payload, used)

    def malloc(self, sizes) -> list[int]:
        """Device addresses for each requested size, in order (0 where none fits)."""
        top, blocks = self._blocks()
        free = [b for b in blocks if not b[2]]   # by address: first fit is the first here
        changed = []
        out = []
        for size in sizes:
            size = int(size)
            if size <= 0 or size > self.size:
                out.append(0)
                continue
            need = (size + 15) & ~15
            k = next((k for k, b in enumerate(free) if b[1] >= need), None)
            if k is not None:
                block = free.pop(k)
                spare = block[1] - need
                if spare >= 2 * HEADER:  # worth a block of its own
                    block[1] = need
                    rest = [block[0] + HEADER + need, spare - HEADER, 0]
                    free.insert(k, rest)
                    changed.append(rest)
                block[2] = 1
            elif top + HEADER + need <= self.size:
                block = [top, need, 1]
                top += HEADER + need
            else:
                out.append(0)  # the heap is exhausted: malloc returns NULL
                continue
            changed.append(block)
            out.append(self.base + block[0] + HEADER)
        self._write(top, changed)
        return out

    def free(self, addresses, lanes, line: int) -> None:
        """Free each address (NULL does nothing); one malloc did not return, or that is
        already free, is a fault of the lane that passed it."""
        top, blocks = self._blocks()
        by_payload = {self.base + b[0] + HEADER: b for b in blocks}
        changed = []
        for address, lane in zip(addresses, lanes, strict=True):
            address = int(address)
            if address == 0:
                continue
            block = by_payload.get(address)
            if block is None or not block[2]:
                what = "already freed" if block is not None else \
                    "not a pointer that device malloc returned"
                raise Fault(CUDA_ERROR_ILLEGAL_ADDRESS, f"Invalid free of 0x{address:x}",
                            f"the address is {what}", int(lane), line)
            block[2] = 0
            changed.append(block)
        self._write(top, changed)
