"""Fixtures for the emulator tests: a device (memory + argument packing) and a CUDA runner."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from vgpu.server.emu import DeviceMemory, PtxModule, launch


class Device:
    """A DeviceMemory with an allocator, module variable mapping and argument packing."""

    def __init__(self) -> None:
        self.memory = DeviceMemory()
        self._next = 0x7F00_0000_0000
        self.symbols: dict[int, dict[str, int]] = {}

    def alloc(self, nbytes: int) -> int:
        address = self._next
        self._next += (max(nbytes, 1) + 0xFFFF) & ~0xFFFF
        self.memory.map(address, max(nbytes, 1))
        return address

    def upload(self, array) -> int:
        array = np.ascontiguousarray(array)
        address = self.alloc(array.nbytes)
        self.memory.write(address, array.tobytes())
        return address

    def zeros(self, count: int, dtype) -> int:
        return self.alloc(count * np.dtype(dtype).itemsize)

    def download(self, address: int, count: int, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        return np.frombuffer(self.memory.read(address, count * dtype.itemsize), dtype).copy()

    def load(self, ptx: str) -> PtxModule:
        module = PtxModule.parse(ptx)
        self.map_variables(module)
        return module

    def map_variables(self, module: PtxModule) -> None:
        symbols = {name: self.alloc(var.size) for name, var in module.variables.items()}
        for name, var in module.variables.items():
            self.memory.write(symbols[name], var.initial_bytes(symbols))
        self.symbols[id(module)] = symbols

    def pack(self, module: PtxModule, kernel: str, args) -> bytes:
        info = module.kernels[kernel]
        if len(args) != len(info.params):
            raise TypeError(f"{kernel} takes {len(info.params)} arguments, got {len(args)}")
        buffer = bytearray(info.param_size)
        for param, value in zip(info.params, args, strict=True):
            if isinstance(value, (bytes, bytearray)):
                data = bytes(value)
            elif isinstance(value, np.generic):
                data = value.tobytes()
            elif isinstance(value, float):
                data = struct.pack("<f" if param.size == 4 else "<d", value)
            else:
                data = (int(value) & ((1 << (8 * param.size)) - 1)).to_bytes(param.size,
                                                                              "little")
            buffer[param.offset:param.offset + len(data)] = data
        return bytes(buffer)

    def launch(self, module: PtxModule, kernel: str, grid, block, *args, shared: int = 0):
        return launch(module, kernel, grid, block, shared_bytes=shared,
                      params=self.pack(module, kernel, args), memory=self.memory,
                      symbols=self.symbols.get(id(module), {}))


@pytest.fixture
def device() -> Device:
    return Device()


@pytest.fixture(scope="module")
def module_device() -> Device:
    """One device for a whole module (property tests run many examples against it)."""
    return Device()


@pytest.fixture
def cuda(toolkit, device):
    """Compile CUDA C to PTX (cached per run) and load it into the device."""
    def compile_and_load(source: str, arch: str = "compute_75", flags=None) -> PtxModule:
        return device.load(toolkit.ptx(source, arch=arch, flags=flags))
    return compile_and_load
