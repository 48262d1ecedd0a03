"""Copies straight between a local client's pageable memory and device memory.

A pageable host buffer is, for CUDA, just an address in the application. When the client
runs on this host, the server reads or writes that address itself with process_vm_readv /
process_vm_writev: one memcpy, where staging through shared memory costs two. The kernel
allows it when the server may ptrace the client (same user, no Yama restriction or the
client named us with PR_SET_PTRACER); the session probes it once at hello and the client
uses the staging ring otherwise.
"""

from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor

__all__ = ["read_peer", "write_peer", "PeerMemoryError"]

_libc = ctypes.CDLL(None, use_errno=True)


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


for _name in ("process_vm_readv", "process_vm_writev"):
    _fn = getattr(_libc, _name)
    _fn.restype = ctypes.c_ssize_t
    _fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                    ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]


class PeerMemoryError(OSError):
    """The client's memory could not be read or written (bad address, no permission)."""


def _transfer(fn, pid: int, local: memoryview, remote_address: int) -> None:
    buffer = (ctypes.c_char * len(local)).from_buffer(local)
    done, total = 0, len(local)
    while done < total:  # the kernel may move less than asked; continue where it stopped
        local_iov = _IoVec(ctypes.addressof(buffer) + done, total - done)
        remote_iov = _IoVec(remote_address + done, total - done)
        moved = fn(pid, ctypes.byref(local_iov), 1, ctypes.byref(remote_iov), 1, 0)
        if moved <= 0:
            err = ctypes.get_errno()
            raise PeerMemoryError(err, f"{os.strerror(err)} at 0x{remote_address + done:x} "
                                       f"in process {pid}")
        done += moved
    del buffer


# Large transfers are shared by two threads, the caller and a helper: the copy is the
# kernel's (the GIL is released in the foreign call), and one core alone does not saturate
# memory bandwidth. They take PIECE_BYTES at a time from one list rather than a half each:
# on a shared machine one of them is often descheduled for a while, and with fixed halves
# the whole copy then waited for the late half (measured under load: 0.70x of a numpy copy
# with halves, 0.82x with 4 MiB pieces; as fast as halves when the cores are free).
PARALLEL_BYTES = 8 << 20
PIECE_BYTES = 4 << 20
_helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vgpu-peer-copy")


def _split(fn, pid: int, local: memoryview, remote_address: int) -> None:
    if len(local) < PARALLEL_BYTES:
        _transfer(fn, pid, local, remote_address)
        return
    offsets = iter(range(0, len(local), PIECE_BYTES))  # next() is atomic: one list for both

    def take_pieces() -> None:
        for offset in offsets:
            _transfer(fn, pid, local[offset:offset + PIECE_BYTES], remote_address + offset)

    helper = _helper.submit(take_pieces)
    try:
        take_pieces()
    finally:
        failure = helper.exception()  # wait for it in any case: it still uses `local`
    if failure is not None:
        raise failure


def read_peer(pid: int, remote_address: int, into: memoryview) -> None:
    """Fill `into` from `len(into)` bytes at `remote_address` in process `pid`."""
    _split(_libc.process_vm_readv, pid, into, remote_address)


def write_peer(pid: int, remote_address: int, data: memoryview) -> None:
    """Write `data` to `remote_address` in process `pid`."""
    _split(_libc.process_vm_writev, pid, data, remote_address)
