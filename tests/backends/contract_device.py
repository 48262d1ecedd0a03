"""The backend contract suite's device: a backend driven as a session drives it, with an
arena handing out its addresses, and the packing of kernel arguments."""

from __future__ import annotations

import struct

from vgpu.server.arena import VaArena
from vgpu.server.backends import Backend, LoadedModule, open_backend
from vgpu.server.server import ARENA_BASE, ARENA_SPAN
from vgpu.server.session import MANAGED_ALIGNMENT

__all__ = ["KINDS", "Device", "pack", "f32", "f64", "i32", "ptr"]

# NAME-process: backend NAME in a device process of its own, behind the proxy a server uses
# for sessions in processes of their own (server/backends/isolated.py).
KINDS = ("emu", "emu-process", "cuda", "cuda-process")
PRINTF_FIFO_BYTES = 1 << 20


# ----------------------------------------------------------------- kernel arguments

def f32(value: float) -> bytes:
    return struct.pack("<f", value)


def f64(value: float) -> bytes:
    return struct.pack("<d", value)


def i32(value: int) -> bytes:
    return struct.pack("<i", value)


def ptr(address: int) -> bytes:
    return struct.pack("<Q", address)


# ----------------------------------------------------------------- a backend and its arena

class Device:
    """A backend as a session drives it: addresses from an arena (the first session slot's,
    split in a region per device), memory mapped there, modules loaded with their variables
    in the arena where the backend asks for places."""

    def __init__(self, kind: str, devices: int = 1):
        self.backend: Backend = open_backend(kind.removesuffix("-process"),
                                             own_process=kind.endswith("-process"))
        self.arena = VaArena(ARENA_BASE, ARENA_SPAN)
        self.arena.split(devices)
        self.closed = False
        self.backend.attach_arena(self.arena.base, self.arena.size, self.arena.region_starts())

    def alloc(self, size: int, at: int | None = None, device: int = 0) -> int:
        address = self.arena.alloc(size, at, region=device)
        assert address is not None, f"the arena has no room for {size} bytes at {at}"
        with self.backend.running():
            self.backend.map(address, size, device=device)
        return address

    def region_of(self, address: int) -> int:
        """The device whose region of the arena holds `address`."""
        return sum(start <= address for start in self.arena.region_starts()) - 1

    def free(self, address: int) -> None:
        with self.backend.running():
            self.backend.unmap(address)
        self.arena.free(address)

    def upload(self, data: bytes, at: int | None = None, device: int = 0) -> int:
        address = self.alloc(len(data), at, device)
        self.write(address, data)
        return address

    def write(self, address: int, data: bytes) -> None:
        with self.backend.running():
            self.backend.write(address, memoryview(data))

    def read(self, address: int, size: int) -> bytes:
        out = bytearray(size)
        with self.backend.running():
            self.backend.read_into(address, memoryview(out))
        return bytes(out)

    def load(self, image: bytes, places: list[int] | None = None,
             device: int = 0) -> LoadedModule:
        """Load a module; its variables at the arena's next free places, or at `places`
        (where a restore puts them back). The module's `places` say where they went."""
        wanted = iter(places) if places is not None else None
        allocated: list[int] = []

        def allocate(size: int, managed: bool = False) -> int:
            address = self.arena.alloc(size, next(wanted) if wanted else None,
                                       MANAGED_ALIGNMENT if managed else None, device)
            assert address is not None, f"no room for a {size}-byte module variable"
            allocated.append(address)
            return address

        with self.backend.running():
            module = self.backend.load_module(image, allocate, device)
        module.places = allocated
        return module

    def launch(self, module: LoadedModule, kernel: str, grid: int, block: int,
               *args: bytes, shared: int = 0) -> tuple[str, str]:
        """Run `kernel` to its end: (device printf output, report for stderr)."""
        with self.backend.running():
            launcher = self.backend.prepare_launch(module, kernel, (grid, 1, 1), (block, 1, 1),
                                                   shared)
            result = launcher(pack(module, kernel, args), PRINTF_FIFO_BYTES)
            self.backend.synchronize()
        return result

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.backend.close()


def pack(module: LoadedModule, kernel: str, args: tuple[bytes, ...]) -> bytes:
    """A parameter buffer laid out as the backend described the kernel."""
    description = module.kernels[kernel]
    assert len(args) == len(description.param_sizes), f"{kernel}: wrong argument count"
    buffer = bytearray(description.param_buffer_size)
    for offset, size, value in zip(description.param_offsets, description.param_sizes, args,
                                   strict=True):
        assert len(value) == size, f"{kernel}: a {size}-byte parameter given {len(value)}"
        buffer[offset:offset + size] = value
    return bytes(buffer)
