"""Calls between the server and a session's device process (isolated.py, device_process.py).

Each side is an `Endpoint` on one end of a Unix stream socket. A call names an object of the
other side (its root, or one it handed out before) and a method; its arguments and result
travel as pickles in which plain data (numbers, strings, bytes, containers, the backend
interface's dataclasses) goes by value, file descriptors go beside the message (SCM_RIGHTS:
the receiver gets its own), and every other object stays where it lives and goes by
reference: the receiver gets a `RemoteObject` whose calls come back to it. So a backend's
events, modules and launchers stay in the device process, and a callback the server hands a
backend (a module's `allocate`) is called back in the server. While one side waits for a
reply it serves the other's calls, so callbacks may nest. A call may also be posted, not
waited for (a launch a GPU queues anyway): messages arrive in order, so it runs before the
next call, and its failure is that call's, as CUDA reports a launch's failure at a later
call.

Pickle is safe here: both ends are vgpu's own processes, the device process started by the
server; what a client sends reaches the channel only as a backend call's numbers and bytes.
"""

from __future__ import annotations

import array
import collections
import contextlib
import dataclasses
import io
import pickle
import socket
import struct
from collections.abc import Callable
from typing import Any

from .base import DeviceDescription, FileDescriptor, KernelDescription, LoadedModule, SharedMemory

__all__ = ["ChannelClosed", "Endpoint", "ForeignObject", "RemoteObject"]

_HEADER = struct.Struct("<QB")  # payload length, descriptors passed with the header
_MAX_FDS = 64
_FD_BYTES = array.array("i").itemsize
_FIRST_READ = 64 << 10  # the most one read takes: most messages fit it whole
_SCALARS = frozenset({type(None), bool, int, float, str, bytes})
_DATACLASSES = frozenset({DeviceDescription, KernelDescription, LoadedModule, SharedMemory})


class ChannelClosed(Exception):
    """The other process is gone (it exited, was killed, or closed its end)."""


@dataclasses.dataclass(frozen=True)
class _Ref:
    """An object on the wire: `theirs` from the receiver's view means the receiver owns it."""

    number: int
    receivers: bool  # True: the number is one the receiver handed out


@dataclasses.dataclass(frozen=True)
class _FdSlot:
    index: int


class RemoteObject:
    """An object of the other process: calling it, or `call_method`, runs there."""

    def __init__(self, endpoint: Endpoint, number: int) -> None:
        self.endpoint, self.number = endpoint, number

    def __call__(self, *args, **kwargs):
        return self.endpoint.call(self.number, None, args, kwargs)

    def __del__(self) -> None:
        # Told to the owner with the next message (appending is atomic: any thread may
        # drop the last reference).
        self.endpoint.dropped.append(self.number)


class Endpoint:
    """One side of the channel; `root` answers calls that name no object. Not thread-safe:
    its owner makes one call at a time."""

    def __init__(self, sock: socket.socket, root: object, owner: object = None) -> None:
        self._sock, self._root = sock, root
        self.owner = owner  # whom this side's RemoteObjects belong to (a session's backend)
        self._exports: dict[int, object] = {}  # objects handed out, by number
        self._next = 1
        self.dropped: list[int] = []  # the other side's objects no longer referenced here
        self._held: BaseException | None = None  # a posted call's failure, for the next call
        self._buffered = bytearray()  # received, not yet taken as a message
        self._fds: collections.deque[int] = collections.deque()  # received with it

    # ----------------------------------------------------------------- calls

    def call(self, target: int | None, method: str | None, args: tuple, kwargs: dict,
             takes_held: bool = True):
        """Run `target.method(*args, **kwargs)` (target None: the other side's root; method
        None: call the target itself) there, serving its calls here meanwhile. Where a
        posted call failed before it, this one fails with that failure instead of running,
        unless `takes_held` is false (a call that only gives something back runs anyway)."""
        self._request("call", target, method, args, kwargs, takes_held)
        return self.serve(until_reply=True)

    def post(self, target: int | None, method: str | None, args: tuple, kwargs: dict) -> None:
        """Run `target.method(*args, **kwargs)` there without waiting: its result is
        dropped, and its failure (the first, if several) is the next call's (see call)."""
        self._request("post", target, method, args, kwargs, False)

    def _request(self, kind: str, target: int | None, method: str | None, args: tuple,
                 kwargs: dict, takes_held: bool) -> None:
        fds: list[int] = []
        self._send((kind, target, method, self._out(args, fds), self._out(kwargs, fds),
                    takes_held), fds)

    def serve(self, until_reply: bool = False):
        """Answer the other side's calls: until it closes (a device process's main loop),
        or until the reply to this side's own call comes (its value, or its exception
        raised here)."""
        while True:
            message, fds = self._receive()
            kind = message[0]
            if kind == "return":
                return self._in(message[1], fds)
            if kind == "raise":
                raise message[1]
            _, target, method, args, kwargs, takes_held = message
            if kind == "call" and takes_held and self._held is not None:
                held, self._held = self._held, None
                self._send_exception(held)
                continue
            try:
                obj = self._root if target is None else self._exports[target]
                function = obj if method is None else getattr(obj, method)
                value = function(*self._in(args, fds), **self._in(kwargs, fds))
            except BaseException as exc:  # noqa: BLE001  (it goes to the caller)
                if kind == "post":
                    self._held = self._held or exc
                else:
                    self._send_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            if kind == "call":
                out_fds: list[int] = []
                self._send(("return", self._out(value, out_fds)), out_fds)

    def _send_exception(self, exc: BaseException) -> None:
        try:
            pickle.dumps(exc)
        except Exception:  # noqa: BLE001  (an exception holding what does not pickle)
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        self._send(("raise", exc), [])

    # ----------------------------------------------------------------- values

    def _out(self, value: Any, fds: list[int]) -> Any:
        """`value` as it travels: plain data by value, objects by reference."""
        return _walk(value, lambda leaf: self._leaf_out(leaf, fds))

    def _leaf_out(self, value: Any, fds: list[int]) -> Any:
        kind = type(value)
        if kind is memoryview:
            return bytes(value)
        if kind is FileDescriptor:
            if len(fds) == _MAX_FDS:
                raise ValueError(f"a message carries at most {_MAX_FDS} descriptors")
            fds.append(value.fd)
            return _FdSlot(len(fds) - 1)
        if kind is RemoteObject:
            if value.endpoint is not self:
                raise ForeignObject("an object of another process cannot be passed on")
            return _Ref(value.number, True)
        number, self._next = self._next, self._next + 1
        self._exports[number] = value
        return _Ref(number, False)

    def _in(self, value: Any, fds: list[int]) -> Any:
        return _walk(value, lambda leaf: self._leaf_in(leaf, fds))

    def _leaf_in(self, value: Any, fds: list[int]) -> Any:
        kind = type(value)
        if kind is _FdSlot:
            return FileDescriptor(fds[value.index])
        if kind is _Ref:
            return self._exports[value.number] if value.receivers \
                else RemoteObject(self, value.number)
        raise TypeError(f"unexpected {kind.__name__} on the channel")

    # ----------------------------------------------------------------- framing

    # One system call a message each way where it fits (the header, the pickle and any
    # descriptors in one sendmsg; one read takes a small message whole): a call and its
    # reply wake the other process twice, not eight times.
    def _send(self, message: tuple, fds: list[int]) -> None:
        dropped, self.dropped = self.dropped, []
        buffer = io.BytesIO()
        buffer.write(bytes(_HEADER.size))
        pickle.dump((dropped, message), buffer, protocol=pickle.HIGHEST_PROTOCOL)
        data = buffer.getbuffer()
        _HEADER.pack_into(data, 0, len(data) - _HEADER.size, len(fds))
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] \
            if fds else []
        try:
            with _socket_errors():
                sent = self._sock.sendmsg([data], ancillary)
                if sent < len(data):
                    self._sock.sendall(data[sent:])
        finally:
            data.release()

    def _receive(self) -> tuple[tuple, list[int]]:
        """The next message and the descriptors that came with it. Posted calls let several
        messages arrive together: what is read past one message waits for the next."""
        buffered = self._buffered
        while len(buffered) < _HEADER.size:
            self._read_some()
        size, count = _HEADER.unpack_from(buffered)
        end = _HEADER.size + size
        if size > _FIRST_READ and len(buffered) < end:
            # A large message (a module's image): the rest straight into a buffer of its own.
            payload = bytearray(size)
            have = len(buffered) - _HEADER.size
            payload[:have] = buffered[_HEADER.size:]
            buffered.clear()
            self._read_into(memoryview(payload)[have:])
        else:
            while len(buffered) < end:
                self._read_some()
            payload = bytes(buffered[_HEADER.size:end])
            del buffered[:end]
        if len(self._fds) < count:
            raise ChannelClosed("a message came without the descriptors it announced")
        fds = [self._fds.popleft() for _ in range(count)]
        dropped, message = pickle.loads(payload)
        for number in dropped:
            self._exports.pop(number, None)
        return message, fds

    def _read_some(self) -> None:
        """Whatever the socket has (a first read's worth at most), and its descriptors."""
        with _socket_errors():
            data, ancillary, _, _ = self._sock.recvmsg(
                _FIRST_READ, socket.CMSG_SPACE(_MAX_FDS * _FD_BYTES))
        if not data:
            raise ChannelClosed("the other process closed the channel")
        self._buffered += data
        for level, kind, passed in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                self._fds.extend(array.array("i", passed[:len(passed) - len(passed) % _FD_BYTES]))

    def _read_into(self, view: memoryview) -> None:
        """Fill `view` from the socket (the rest of a message)."""
        done = 0
        while done < len(view):
            with _socket_errors():
                count = self._sock.recv_into(view[done:])
            if not count:
                raise ChannelClosed("the other process closed the channel mid-message")
            done += count


@contextlib.contextmanager
def _socket_errors():
    """A socket error means the other process is gone."""
    try:
        yield
    except OSError as exc:
        raise ChannelClosed(f"the other process is gone ({exc.strerror})") from None


def _walk(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """`value` with each part that is not plain data (a scalar, a container, a dataclass of
    the backend interface) replaced by `leaf(part)`."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is tuple or kind is list or kind is set or kind is frozenset:
        return kind(_walk(item, leaf) for item in value)
    if kind is dict:
        return {key: _walk(item, leaf) for key, item in value.items()}
    if kind in _DATACLASSES:
        return dataclasses.replace(value, **{
            f.name: _walk(getattr(value, f.name), leaf) for f in dataclasses.fields(value)})
    return leaf(value)


class ForeignObject(ValueError):
    """A RemoteObject of another channel given to this one (another session's event)."""

