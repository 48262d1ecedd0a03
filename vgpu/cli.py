"""The `vgpu` command: `run` an unmodified CUDA program, `server` a device, `ps` the sessions."""

from __future__ import annotations

import argparse
import contextlib
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
    p.add_argument("--memcheck", default="report", choices=("report", "strict"),
                   help="what a kernel's access past its allocation's end does, for clients "
                        "whose VGPU_MEMCHECK does not say: reported once per kernel (report, "
                        "as a GPU does not fault) or CUDA_ERROR_ILLEGAL_ADDRESS (strict)")
    p.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="where sessions' checkpoint images go (DIR/TOKEN.vgpu); a server "
                        "reading the same folder restores a client whose server died")
    p.add_argument("--checkpoint-every", type=float, default=None, metavar="SECONDS",
                   help="checkpoint each running session this often (needs --checkpoint-dir)")


def _add_run_parser(sub) -> None:
    p = sub.add_parser("run", help="run a CUDA program through vgpu",
                       usage="vgpu run [--server ADDR] [--backend B] -- CMD [ARGS...]")
    p.add_argument("--server", default=None,
                   help="address of a running vgpu server, or a comma-separated list: the "
                        "first, then standbys to fail over to (default: the user's default "
                        "server when it runs, else a private one started for this run)")
    p.add_argument("--backend", default=None, choices=("auto", "emu", "cuda"),
                   help="start a private server with this backend for this run")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")


def _add_ps_parser(sub) -> None:
    p = sub.add_parser("ps", help="list the sessions of running vgpu servers")
    p.add_argument("--server", default=None, help="ask only this server")


class _VersionAction(argparse.Action):
    """`--version`: the installed version, looked up only when asked for (importlib.metadata
    scans every installed distribution, some 15 ms that `vgpu run` should not pay)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show the version and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("vgpu")
        except PackageNotFoundError:  # run from a source tree that was never installed
            text = "unknown (not installed)"
        print(f"vgpu {text}")  # on stdout, as argparse's own version action
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vgpu", description=__doc__)
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="verb")
    _add_server_parser(sub)
    _add_run_parser(sub)
    _add_ps_parser(sub)
    args = parser.parse_args(argv)
    if args.verb is None:  # a usage error, as argparse treats one: help on stderr, status 2
        parser.print_help(sys.stderr)
        return 2
    return {"server": _server, "run": _run, "ps": _ps}[args.verb](args)


# ----------------------------------------------------------------- vgpu server

def _server(args) -> int:
    import logging

    from vgpu.addresses import (
        AddressError,
        check_address,
        claim_ipc_socket,
        folder_turn,
        ipc_path,
        remove_socket_file,
        socket_folder,
    )
    from vgpu.client import default_server_address
    from vgpu.registry import announce, runtime_dir, withdraw

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="vgpu server: %(message)s")
    address = args.listen or default_server_address()
    socket_file = ipc_path(address)
    from vgpu.server.server import ProxyServer

    with contextlib.ExitStack() as turn:
        try:
            check_address(address, listen=True)
            if socket_file is not None:
                turn.enter_context(folder_turn(socket_folder(socket_file, str(runtime_dir()))))
                claim_ipc_socket(socket_file)
            server = ProxyServer(address, args.backend, args.memcheck,
                                 checkpoint_dir=args.checkpoint_dir,
                                 checkpoint_every=args.checkpoint_every)
        except AddressError as exc:
            print(f"vgpu server: cannot listen on {address}: {exc}", file=sys.stderr)
            return 1
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
        if socket_file is not None:
            remove_socket_file(socket_file)
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

    from vgpu.addresses import AddressError, check_address

    if args.server is not None and args.backend is not None:
        print("vgpu run: --backend is for a private server; --server names a running one",
              file=sys.stderr)
        return 2
    server = None
    address, named_by = args.server, "--server "
    # --backend on the command line asks for a private server, whatever VGPU_SERVER says.
    if address is None and args.backend is None and os.environ.get("VGPU_SERVER"):
        address, named_by = os.environ["VGPU_SERVER"], "VGPU_SERVER="
    if address is not None:
        # A comma list names standbys: the session fails over to the next one (vgpu.client).
        from vgpu.client import server_addresses

        addresses = server_addresses(address)
        if not addresses:
            print(f"vgpu run: {named_by}{address}: no server address given", file=sys.stderr)
            return 2
        for one in addresses:
            try:
                check_address(one)
            except AddressError as exc:
                which = "" if one == address else f" ({one})"
                print(f"vgpu run: {named_by}{address}{which}: {exc}", file=sys.stderr)
                return 2
    elif args.backend is None:
        address = _running_default_server()
    if address is None:
        server, address = _start_private_server(args.backend or "auto")
        if server is None:
            return 1
    try:
        return _run_program(command, address)
    finally:
        if server is not None:
            _stop(server, address)


def _running_default_server() -> str | None:
    """The user's default server if one answers there: programs run with plain `vgpu run`
    share it (and its device) instead of each starting a server of its own."""
    from vgpu.addresses import AddressError, ipc_path, listener_pid
    from vgpu.client import default_server_address
    from vgpu.registry import ask_sessions

    address = default_server_address()
    try:
        if listener_pid(ipc_path(address)) is None:
            return None
    except AddressError as exc:
        print(f"vgpu run: warning: ignoring the default server {address}: {exc}",
              file=sys.stderr)
        return None
    if ask_sessions(address, timeout_s=3) is None:
        print(f"vgpu run: warning: the default server at {address} does not answer; "
              "starting a private one", file=sys.stderr)
        return None
    return address


def _start_private_server(backend: str):
    from vgpu.registry import runtime_dir

    _remove_stale_private_sockets(runtime_dir())
    address = f"ipc://{runtime_dir()}/run-{os.getpid()}-{secrets.token_hex(3)}.sock"
    parent = os.getpid()
    # -P: not the current folder first on sys.path, where a vgpu source tree (the checkout
    # vgpu was installed from) would shadow the installed package.
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "vgpu.cli", "server", "--listen", address, "--backend",
         backend],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: _stop_with_parent(parent))
    line = proc.stdout.readline()  # one line once it listens; EOF if it failed to start
    if not line.startswith("vgpu server listening"):
        proc.wait(timeout=5)
        print("vgpu run: the local vgpu server failed to start", file=sys.stderr)
        return None, None
    proc.stdout.close()
    return proc, address


def _stop_with_parent(parent: int) -> None:
    """In the private server's process, before it starts: a SIGTERM when `vgpu run` dies, even
    killed with SIGKILL, so that no private server is left running with nobody to stop it."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _remove_stale_private_sockets(folder) -> None:
    """Sockets of private servers that are gone (a `vgpu run` that was killed)."""
    from vgpu.addresses import AddressError, listener_pid, remove_socket_file

    for path in folder.glob("run-*.sock"):
        try:
            if listener_pid(str(path)) is None:
                remove_socket_file(str(path))
        except AddressError:
            continue


def _stop(proc: subprocess.Popen, address: str) -> None:
    from vgpu.addresses import ipc_path, remove_socket_file

    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    remove_socket_file(ipc_path(address))  # the server removes it; not if it was killed


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
    from vgpu.addresses import AddressError, check_address, ipc_path, listener_pid
    from vgpu.registry import ask_sessions, live_servers

    if args.server is not None:
        try:
            check_address(args.server)
        except AddressError as exc:
            print(f"vgpu ps: --server {args.server}: {exc}", file=sys.stderr)
            return 2
        servers = [(None, args.server)]
    else:
        servers = live_servers()
        if not servers:
            print("no vgpu server is running")
            return 0
    status = 0
    for pid, address in servers:
        try:
            socket_file = ipc_path(address)
            if socket_file is not None:
                pid = listener_pid(socket_file)
                if pid is None:
                    print(f"vgpu ps: no vgpu server at {address}", file=sys.stderr)
                    status = 1
                    continue
        except AddressError as exc:
            print(f"vgpu ps: {address}: {exc}", file=sys.stderr)
            status = 1
            continue
        sessions = ask_sessions(address, timeout_s=3)
        if sessions is None:
            print(f"vgpu ps: no answer from {address}", file=sys.stderr)
            status = 1
            continue
        _print_server(address, pid, sessions)
    return status


def _print_server(address: str, pid: int | None, sessions: list[dict]) -> None:
    served_by = f" (pid {pid})" if pid is not None else ""
    count = f"{len(sessions)} session{'s' * (len(sessions) != 1)}" if sessions else "no sessions"
    print(f"server {address}{served_by}: {count}")
    if not sessions:
        return
    print(f"  {'PID':>8}  {'BACKEND':7}  {'MEMORY':>10}  {'CALLS':>8}  {'QUEUED':>6}  COMMAND")
    for s in sessions:
        command = " ".join(s["command"].split())  # one row per session, whatever argv holds
        print(f"  {s['pid']:>8}  {s['backend']:7}  {_human(s['memory']):>10}  {s['calls']:>8}  "
              f"{s.get('queued', 0):>6}  {command}")


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


if __name__ == "__main__":
    sys.exit(main())
