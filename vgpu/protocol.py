"""The vgpu wire protocol: framing, versions and the handshake.

Transport: a zmq DEALER (client) to ROUTER (server) pair. Every message is a multipart zmq
message whose first frame is a msgpack header and whose further frames are raw payloads
(bulk data sent without copying into the header).

    client -> server   [header, payload*]   header = [kind, seq, body]
    server -> client   [header, payload*]
                       header = [seq, code, result, deferred, output, diagnostics]

kind is one of:
    HELLO   body = {"version", "pid", "host", "argv", "shm", "probe", "memcheck", "token",
            "resume", "arena"}: opens the session; "memcheck" is the application's VGPU_MEMCHECK
            (None: the server's); "token" (32 hex digits) names the session, the same at
            every hello of one client, across servers; "resume" is None at the first hello,
            {"position": N} when the session moves here (see "Moving sessions"). The reply
            says, besides the server's pid, host and device, "position": the messages the
            session's state here covers (0 for a fresh session). "arena" (optional, a fresh
            session only) asks for the session's addresses to start where they started in
            another session: a replay's calls use the addresses its recording got. A
            server that records sessions answers "shm", "peer_memory" and
            "device_windows" false: every byte then travels in the messages it records.
            "shm" ({"fd", "size"}: the staging ring, a memory file the client holds open as
            descriptor "fd" until this answer) and the host segments of vgpuMapHostSegment
            (seg_id, fd, size, device_address: likewise, until the call's answer) are mapped
            only for a client on a local socket whose kernel-reported pid is the hello's
            "pid", through /proc/PID/fd/FD of that pid, and only files owned by it, of that
            size and sealed against shrinking (see vgpu.sealed_files,
            vgpu.server.client_files); "probe" is read from that pid only. Otherwise the
            reply says "shm" false and data travels in payload frames. vgpuMapHostSegment
            answers None when kernels reach the segment at device_address, else why they
            do not (copies still do).
    CALLS   body = [[op, args], ...]: driver calls in order; the server replies only when the
            header's seq is non-zero (the last call then is the synchronizing one)
    RELEASE body = None: the client finished copying through the device window the server
            last granted it (vgpuDeviceWindow); handled on arrival, not queued
    HOSTFN  body = gate: the client ran the host function of that gate (vgpuHostFunc), whose
            turn a {"host_functions": [gate, ...]} notice announced; the stream it holds
            goes on. Handled on arrival, not queued
    ADMIN   body = [op, args]: `ps` and friends, answered without a session
    BYE     body = None: the client is leaving; its session is released

While a session's worker is busy (a long kernel), the server sends it a reply with seq 0
(KEEPALIVE) every half second: a client waiting for an answer then knows the server is
working, not gone, however long the kernel runs; VGPU_TIMEOUT bounds only silence. A
seq-0 reply with a non-zero code says the server is going away (code 46, the result says
why: "the server is shutting down"); the client fails its calls from then on.

Seq-0 replies with code 0 may carry a notice in their result (None: a plain keepalive):
    {"checkpointed": N}   a checkpoint covering messages <= N is written where a standby
                          server can restore it
    {"redirect": ADDRESS, "position": N}   the session moved to ADDRESS, where its state
                          covers the first N messages
    {"progress": [phase, done, total]}   to an admin client, while its request runs
    {"host_functions": [gate, ...]}   the turn of these host functions came (vgpuHostFunc):
                          the client runs them, in order, and answers each with HOSTFN
A suspended session's calls wait for its resume; while any are held, the client hears
plain keepalives.

Moving sessions. Every CALLS message has a position, its 1-based count since the first
hello; client and server count the same messages (HELLO, RELEASE, HOSTFN, ADMIN and BYE do
not count). A reply to the message at position p confirms every message up to p, except a
vgpuQuery's "not ready", which is answered ahead of the work it is about. On a redirect the
client says hello at ADDRESS with its token and "resume": {"position": N}. With a failover
list (VGPU_SERVER="ADDR1,ADDR2"), when its server is gone (pid gone, silence, "shutting
down") the client says hello at the next address with "resume": {"position": P}, P being
the last message the client no longer holds (a checkpoint covered it); that server restores
the token's checkpoint if it has one. Either way the hello's reply says the position R the
session's state there covers, and the client sends again every message after R that it
holds, each under its first seq while its reply is awaited; one whose reply was consumed
goes with seq 0 and without the calls that only read (copies to the host, vgpuQuery,
vgpuSynchronize, vgpuDeviceWindow, cuMemGetInfo, cuEventElapsedTime). The last of those
ends with the call vgpuDiscardReported: the errors and device output their replay produced
again were reported once already. Data staged in the ring goes to the same offsets of the
new session's ring.

Dropped connections. A TCP connection may drop while client and server both live (a
network blip); zmq heartbeats on both ends (1 s, 4 s timeout) close one that went silent.
The client then says hello again on a new connection, with its token and "resume":
{"position": N, "waiting": [seqs]}: if this server still holds a live session with that
token, it rebinds it to the new connection, answers with the position R its state covers
(every message it received), and then sends again the replies to `waiting` it had sent;
the client resends its messages after R as after a move. A message is counted only when it
arrives on the connection its session is bound to, so none runs twice. A session whose
connection dropped ends once its grace period (`vgpu server --reconnect-grace`, 5 s) passes
without such a hello.

Ops inside CALLS are driver-API names (`cuMemAlloc_v2`, `cuLaunchKernel`, ...) plus a few
`vgpu*` transport helpers; see `vgpu.server.session` for the handlers.

In a reply, `code` is the CUresult of the synchronizing call and `result` its result (on
failure: what went wrong, in words); `deferred` is 0 or [code, message] of the first error
raised by queued calls since the previous reply (queued calls get no reply of their own, so
their errors surface at the next synchronizing call, as CUDA's asynchronous errors do);
`output` is device printf text for the application's stdout and `diagnostics` text for its
stderr, written after it: CUDA's line for each failed device assert, the memory checker's
reports, and a kernel fault's description (kernel, block, thread, PTX line, address), which
CUDA leaves to compute-sanitizer.

Bulk data travels as `("shm", offset)` into the session's staging segment when client and
server share a host, as `("seg", segment_id, offset)` into a pinned host segment, or as
`("frame", index)` into the message's payload frames otherwise. Without shared memory, a
copy larger than 2 MiB streams in chunks, a message each, the first message starting with
the call `vgpuTransfer(direction, total)` ("HtoD" or "DtoH", bytes), which `vgpu ps` shows
the copy's progress against.
"""

from __future__ import annotations

from collections.abc import Callable

import msgpack

__all__ = [
    "PROTOCOL_VERSION", "HELLO", "CALLS", "ADMIN", "BYE", "RELEASE", "HOSTFN", "pack", "packer",
    "unpack", "ProtocolError",
    "DEFAULT_TIMEOUT_S", "HANDSHAKE_TIMEOUT_S", "KEEPALIVE_SEQ", "STICKY_ERRORS",
    "MEMCHECK_MODES", "VMM_GRANULARITY", "HOST_PAGE", "IPC_HANDLE_BYTES", "IPC_MARKERS",
]

PROTOCOL_VERSION = 5  # 5: shared memory files named by descriptor, not path
HELLO, CALLS, ADMIN, BYE, RELEASE = "hello", "calls", "admin", "bye", "release"
HOSTFN = "hostfn"

# How long a client waits for a server that has gone silent before declaring the device lost.
DEFAULT_TIMEOUT_S = 60.0
HANDSHAKE_TIMEOUT_S = 5.0


# Errors that leave a context unusable until it is reset (CUDA's "sticky" errors): illegal
# address, assert, hardware stack error, illegal instruction, misaligned address, invalid
# address space, invalid PC, launch failure.
STICKY_ERRORS = frozenset({700, 710, 714, 715, 716, 717, 718, 719})


# VGPU_MEMCHECK (and `vgpu server --memcheck`): what a kernel's access past the end of its
# allocation does. "report": what a GPU does (no fault where memory is mapped), reported once
# per kernel on stderr; "strict": CUDA_ERROR_ILLEGAL_ADDRESS, as outside mapped memory.
MEMCHECK_MODES = ("report", "strict")


# The virtual memory API's granularity (cuMemGetAllocationGranularity, minimum and
# recommended alike): a GPU's large page, what NVIDIA's GPUs report. Reservations are sized
# in host pages, as CUDA documents.
VMM_GRANULARITY = 2 << 20
HOST_PAGE = 4096


# IPC handles (CUDA's 64 bytes): a marker saying what the handle names, then random bytes the
# server chose (server/ipc.py). The client checks a handle's marker before it asks: a
# shareable VMM handle's file, for one, could hold anything.
IPC_HANDLE_BYTES = 64
IPC_MARKERS = {"memory": b"vgpu-ipc-mem\0\0\0\0", "event": b"vgpu-ipc-event\0\0",
               "vmm": b"vgpu-ipc-vmm\0\0\0\0"}


# The server's "still working on your calls" (see above): a reply to nothing.
KEEPALIVE_SEQ = 0


class ProtocolError(ValueError):
    """A message that does not follow this protocol."""


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def packer() -> Callable[[object], bytes]:
    """`pack` for one thread (a Packer is not thread-safe) that packs a message per round
    trip: a Packer made once costs a third of what `msgpack.packb` costs a message, which
    makes one at every call."""
    return msgpack.Packer(use_bin_type=True).pack


def unpack(data, *, arrays_as_tuples: bool = False) -> object:
    """Decode a header. The server asks for tuples: a batch is hundreds of small arrays, and
    tuples of plain values drop out of the garbage collector's sight at its first pass, so
    they are never scanned again (lists would be, which made full collections dominate the
    cost of decoding)."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False,
                               use_list=not arrays_as_tuples)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"undecodable message header: {exc}") from None
