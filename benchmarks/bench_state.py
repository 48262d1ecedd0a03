"""State that moves: checkpoint, restore and migration of a session's device memory.

    python benchmarks/bench_state.py               # 1 GiB of device memory; figures go to
    python benchmarks/bench_state.py --mib 256     # BENCHMARKS.md

A session on an emu server holds MIB of device memory in four allocations of float32 noise
(as real data, it barely compresses). Each figure is a ratio against a baseline measured in
the same run, on the same file system:
- checkpoint (`vgpu checkpoint`) against a sequential write of the same bytes with one fsync
  at the end (what `dd conv=fsync` does): target >= 0.7x; and how long the session was
  stopped for it: target <= 0.2 s
- restore (suspend, then resume, which reads the image back into fresh device memory)
  against a sequential read of that file, page cache dropped first when we may: >= 0.7x
- an incremental checkpoint after writing 1% of the memory: bytes written against the full
  checkpoint's: target <= 5%
- migration between two local servers, pre-copy against stop-and-copy: the downtime (the
  time the session's calls were held): target <= 0.5 s and >= 5x shorter; once for an idle
  session, once for one that runs kernels all along (then every round compares all memory)
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import zmq

from vgpu.admin import request
from vgpu.protocol import CALLS, HELLO, PROTOCOL_VERSION, pack, unpack

HERE = Path(__file__).resolve().parent
CONTEXT = 7
BLOCK = 4 << 20
MiB = 1 << 20


# A kernel that keeps a session busy while it migrates: each launch writes 32 words.
PTX = b"""
.version 8.0
.target sm_80
.address_size 64
.visible .entry stamp(.param .u64 out)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r1;
    ret;
}
"""
MODULE, STAMP = 20, 21


class Session:
    """A raw protocol client holding device memory on a server."""

    def __init__(self, address: str, token: str | None = None, resume: int | None = None):
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(address)
        self.seq = 0
        self.token = token or secrets.token_hex(16)
        self.request(HELLO, {"version": PROTOCOL_VERSION, "pid": os.getpid(), "host": "bench",
                             "argv": ["bench_state"], "token": self.token,
                             "resume": None if resume is None else {"position": resume}})
        if resume is None:
            self.request(CALLS, [["cuDevicePrimaryCtxRetain", [CONTEXT, 0]],
                                 ["cuModuleLoadData", [MODULE, CONTEXT, ["inline", PTX],
                                                       len(PTX)]],
                                 ["cuModuleGetFunction", [STAMP, MODULE, "stamp"]]])

    def launch_until_moved(self, address: int) -> dict:
        """Launch kernels, each waited for, until the server says the session moved."""
        launch = ["cuLaunchKernel", [STAMP, 1, 1, 1, 32, 1, 1, 0, 0,
                                     address.to_bytes(8, "little")]]
        while True:
            self.seq += 1
            self.socket.send(pack([CALLS, self.seq, [launch]]))
            while True:
                reply = unpack(self.socket.recv_multipart()[0])
                if reply[0] == self.seq:
                    break
                if isinstance(reply[2], dict) and "redirect" in reply[2]:
                    return reply[2]

    def request(self, kind: str, body, frames=()):
        self.seq += 1
        self.socket.send_multipart([pack([kind, self.seq, body]), *frames])
        while True:
            reply = unpack(self.socket.recv_multipart()[0])
            if reply[0] == self.seq:
                if reply[1]:
                    raise RuntimeError(f"{kind} failed: {reply[2]}")
                return reply[2]

    def fill(self, sizes: list[int], rng) -> list[int]:
        addresses = []
        for size in sizes:
            address = self.request(CALLS, [["cuMemAlloc", [CONTEXT, size]]])
            for offset in range(0, size, BLOCK):
                data = rng.standard_normal(BLOCK // 4, dtype=np.float32).tobytes()
                self.request(CALLS, [["cuMemcpyHtoD", [address + offset, ["frame", 0],
                                                        BLOCK]]], [data])
            addresses.append(address)
        return addresses


def admin(address: str, op: str, **args):
    return request(address, op, [args], timeout_s=600)


def start_server(address: str, *options: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "vgpu.cli", "server", "--listen", address,
                             "--backend", "emu", *options], stdout=subprocess.PIPE, text=True)
    if not proc.stdout.readline().startswith("vgpu server listening"):
        raise RuntimeError("the server did not start")
    return proc


def drop_page_cache() -> bool:
    """Drop clean cached pages so reads come from the disk (root only)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def sequential_write(path: Path, total: int, rng) -> float:
    """dd-like: the same amount of incompressible data in BLOCK writes, one fsync."""
    blocks = [rng.standard_normal(BLOCK // 4, dtype=np.float32).tobytes() for _ in range(4)]
    started = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for i in range(total // BLOCK):
            os.write(fd, blocks[i % 4])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - started


def sequential_read(path: Path) -> float:
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buffer = bytearray(BLOCK)
        while f.readinto(buffer):
            pass
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="device memory in the session")
    parser.add_argument("--folder", default=None,
                        help="where images go (default: a temporary folder under /var/tmp)")
    args = parser.parse_args()
    total = args.mib * MiB
    folder = Path(tempfile.mkdtemp(prefix="vgpu-bench-", dir=args.folder or "/var/tmp"))
    rng = np.random.default_rng(1)
    a = start_server(f"ipc://{folder}/a.sock", "--checkpoint-dir", str(folder / "images"))
    b = start_server(f"ipc://{folder}/b.sock")
    try:
        session = Session(f"ipc://{folder}/a.sock")
        addresses = session.fill([total // 4] * 4, rng)
        pid = os.getpid()

        baseline_write = sequential_write(folder / "dd", total, rng)
        cold = drop_page_cache()
        full = admin(f"ipc://{folder}/a.sock", "checkpoint", pid=pid)
        print(f"checkpoint {args.mib} MiB: {full['total_s']:.2f} s, sequential write "
              f"{baseline_write:.2f} s: {baseline_write / full['total_s']:.2f}x; "
              f"stopped {full['stop_s'] * 1000:.0f} ms; image {full['bytes'] / MiB:.0f} MiB")

        touched = total // 100 // 4 * 4
        session.request(CALLS, [["cuMemcpyHtoD", [addresses[1], ["frame", 0], touched]]],
                        [rng.standard_normal(touched // 4, dtype=np.float32).tobytes()])
        incremental = admin(f"ipc://{folder}/a.sock", "checkpoint", pid=pid)
        print(f"incremental after writing 1%: {incremental['written'] / MiB:.1f} MiB written, "
              f"{100 * incremental['written'] / full['written']:.1f}% of the full checkpoint "
              f"({incremental['total_s']:.2f} s, stopped {incremental['stop_s'] * 1000:.0f} ms)")

        suspended = admin(f"ipc://{folder}/a.sock", "suspend", pid=pid)
        drop_page_cache()
        resumed = admin(f"ipc://{folder}/a.sock", "resume", pid=pid)
        drop_page_cache()
        baseline_read = sequential_read(folder / "dd")
        print(f"restore {args.mib} MiB{' (cold cache)' if cold else ''}: "
              f"{resumed['restore_s']:.2f} s, sequential read {baseline_read:.2f} s: "
              f"{baseline_read / resumed['restore_s']:.2f}x (suspend stopped the session "
              f"{suspended['stop_s'] * 1000:.0f} ms)")

        here, there = f"ipc://{folder}/a.sock", f"ipc://{folder}/b.sock"
        # Idle: after the first round, the backend says nothing changed.
        idle = admin(here, "migrate", pid=pid, to=there)
        session = Session(there, session.token, resume=idle["position"])
        # Busy: kernels run all along, so every round (and the stop) compares all memory.
        moving = ThreadPoolExecutor(1).submit(admin, there, "migrate", pid=pid, to=here)
        redirect = session.launch_until_moved(addresses[0])
        busy = moving.result()
        session = Session(here, session.token, resume=redirect["position"])
        stop_and_copy = admin(here, "migrate", pid=pid, to=there, precopy=False)
        for name, moved in (("idle", idle), ("running kernels", busy)):
            print(f"migration of {args.mib} MiB, {name}: downtime pre-copy "
                  f"{moved['downtime_s'] * 1000:.0f} ms ({moved['rounds']} rounds, "
                  f"{moved['total_s']:.2f} s in all), stop-and-copy "
                  f"{stop_and_copy['downtime_s'] * 1000:.0f} ms: "
                  f"{stop_and_copy['downtime_s'] / moved['downtime_s']:.1f}x shorter")
    finally:
        for proc in (a, b):
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
