"""The `vgpu` command: `run` an unmodified CUDA program, `server` a device, `ps` the sessions."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys

__all__ = ["main"]


def _add_server_parser(sub) -> None:
    p = sub.add_parser("server", help="serve a device to vgpu clients")
    p.add_argument("--listen", default=None,
                   help="zmq address to listen on (default: the per-user ipc socket)")
    p.add_argument("--backend", default="auto", choices=("auto", "emu", "cuda"))
    p.add_argument("--verbose", "-v", action="store_true", help="log sessions as they come")


def _add_run_parser(sub) -> None:
    p = sub.add_parser("run", help="run a CUDA program through vgpu",
                       usage="vgpu run [--server ADDR] [--backend B] -- CMD [ARGS...]")
    p.add_argument("--server", default=None,
                   help="address of a running vgpu server (default: start a private one)")
    p.add_argument("--backend", default="auto", choices=("auto", "emu", "cuda"),
                   help="backend of the server started for this run")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")


def _add_ps_parser(sub) -> None:
    p = sub.add_parser("ps", help="list the sessions of running vgpu servers")
    p.add_argument("--server", default=None, help="ask only this server")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vgpu", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True)
    _add_server_parser(sub)
    _add_run_parser(sub)
    _add_ps_parser(sub)
    args = parser.parse_args(argv)
    return {"server": _server, "run": _run, "ps": _ps}[args.verb](args)


# ----------------------------------------------------------------- vgpu server

def _server(args) -> int:
    import logging

    from vgpu.client import default_server_address
    from vgpu.registry import announce, withdraw
    from vgpu.server.server import ProxyServer

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="vgpu server: %(message)s")
    address = args.listen or default_server_address()
    if address.startswith("ipc://"):
        os.makedirs(os.path.dirname(address[len("ipc://"):]), exist_ok=True)
    try:
        server = ProxyServer(address, args.backend)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"vgpu server: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # zmq errors (address in use, bad address)
        print(f"vgpu server: cannot listen on {address}: {exc}", file=sys.stderr)
        return 1
    # Stop serving at once, even from inside a blocking poll; serve_forever then tells the
    # clients, cancels every kernel and releases every session on its way out.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: server.stop())
    announce(server.endpoint)
    print(f"vgpu server listening on {server.endpoint} (backend {args.backend})", flush=True)
    try:
        server.serve_forever()
    finally:
        withdraw()
    return 0


# ----------------------------------------------------------------- vgpu run

def _run(args) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("vgpu run: no command given (vgpu run [options] -- CMD [ARGS...])", file=sys.stderr)
        return 2
    program = shutil.which(command[0])
    if program is None:
        print(f"vgpu run: {command[0]}: command not found", file=sys.stderr)
        return 127
    from vgpu.binary_check import BinaryCheckError, check_executable, static_cudart_message

    try:
        report = check_executable(program)
    except BinaryCheckError as exc:  # unreadable or damaged: let the loader have its say
        print(f"vgpu run: warning: {exc}", file=sys.stderr)
    else:
        if report.has_static_cudart:
            print(f"vgpu run: {static_cudart_message(program)}", file=sys.stderr)
            return 1

    server = None
    address = args.server or os.environ.get("VGPU_SERVER")
    if address is None:
        server, address = _start_private_server(args.backend)
        if server is None:
            return 1
    try:
        return _run_program(command, address)
    finally:
        if server is not None:
            _stop(server)


def _start_private_server(backend: str):
    from vgpu.registry import runtime_dir

    address = f"ipc://{runtime_dir()}/run-{os.getpid()}-{secrets.token_hex(3)}.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vgpu.cli", "server", "--listen", address, "--backend", backend],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    line = proc.stdout.readline()  # one line once it listens; EOF if it failed to start
    if not line.startswith("vgpu server listening"):
        proc.wait(timeout=5)
        print("vgpu run: the local vgpu server failed to start", file=sys.stderr)
        return None, None
    proc.stdout.close()
    return proc, address


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _run_program(command: list[str], address: str) -> int:
    from vgpu.shim.loader import shim_library_dir

    env = dict(os.environ)
    lib_dir = str(shim_library_dir())
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (lib_dir, env.get("LD_LIBRARY_PATH", "")) if p)
    env["VGPU_SERVER"] = address
    try:
        proc = subprocess.Popen(command, env=env)
    except OSError as exc:  # not executable, wrong format: what a shell would say, and 126
        print(f"vgpu run: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 126
    # Signals meant for the program reach it through us; its exit status is what we return.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
    code = proc.wait()
    return 128 - code if code < 0 else code


# ----------------------------------------------------------------- vgpu ps

def _ps(args) -> int:
    import zmq

    from vgpu.protocol import ADMIN, pack, unpack
    from vgpu.registry import live_servers

    servers = [(None, args.server)] if args.server else live_servers()
    rows = []
    ctx = zmq.Context()
    for _, address in servers:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        sock.send_multipart([pack([ADMIN, 1, ["ps", []]])])
        if not sock.poll(3000):
            print(f"vgpu ps: no answer from {address}", file=sys.stderr)
            sock.close()
            continue
        _, code, sessions, *_ = unpack(sock.recv_multipart()[0])
        sock.close()
        rows.extend((address, s) for s in sessions or [])
    ctx.term()
    print(f"{'PID':>8}  {'BACKEND':7}  {'MEMORY':>10}  {'CALLS':>8}  {'QUEUED':>6}  "
          f"{'SERVER':30}  COMMAND")
    for address, s in rows:
        command = " ".join(s["command"].split())  # one row per session, whatever argv holds
        print(f"{s['pid']:>8}  {s['backend']:7}  {_human(s['memory']):>10}  {s['calls']:>8}  "
              f"{s.get('queued', 0):>6}  {address[-30:]:30}  {command}")
    return 0


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


if __name__ == "__main__":
    sys.exit(main())
