"""The `vgpu` command: `run` an unmodified CUDA program, `server` a device, `ps` the sessions,
`checkpoint`, `suspend`, `resume` and `migrate` one, `record` a program's calls, `replay`
them and look into a `trace`."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

from vgpu.security_cli import (
    add_keygen_parser,
    add_run_options,
    add_server_options,
    keygen_command,
    server_access,
    server_address_with_key,
)

__all__ = ["main"]


def _add_server_parser(sub) -> None:
    p = sub.add_parser("server", help="serve a device to vgpu clients")
    p.add_argument("--listen", default=None,
                   help="zmq address to listen on (default: the per-user ipc socket)")
    p.add_argument("--backend", default="auto", choices=("auto", "emu", "cuda"))
    p.add_argument("--devices", type=int, default=None, metavar="N",
                   help="how many devices the server offers: emu, N views of one emulated "
                        "device sharing each session's memory (default 1); cuda, the first "
                        "N of the GPUs the driver offers (default all)")
    p.add_argument("--session-processes", action=argparse.BooleanOptionalAction, default=None,
                   help="run each session's device work in a process of its own, so that a "
                        "device fault or a crash there ends only that session's (default: on "
                        "for cuda, where NVIDIA's driver keeps a device fault for the whole "
                        "process; off for emu, which isolates sessions in one process)")
    p.add_argument("--verbose", "-v", action="store_true", help="log sessions as they come")
    p.add_argument("--memcheck", default="report", choices=("report", "strict"),
                   help="what a kernel's access past its allocation's end does, for clients "
                        "whose VGPU_MEMCHECK does not say: reported once per kernel (report, "
                        "as a GPU does not fault) or CUDA_ERROR_ILLEGAL_ADDRESS (strict)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="emu: run kernels compiled to native code (LLVM) where the compiler "
                        "handles them, else on the interpreter (the default; --no-compile "
                        "or VGPU_EMU_COMPILE=0: every kernel on the interpreter)")
    p.add_argument("--threads", type=_positive, default=None, metavar="N",
                   help="emu, compiled kernels: run blocks on N native threads (default: "
                        "the CPUs the server may use)")
    p.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="where sessions' checkpoint images go (DIR/TOKEN.vgpu); a server "
                        "reading the same folder restores a client whose server died")
    p.add_argument("--checkpoint-every", type=float, default=None, metavar="SECONDS",
                   help="checkpoint each running session this often (needs --checkpoint-dir)")
    p.add_argument("--record", default=None, metavar="DIR",
                   help="record every new session's calls into the trace DIR")
    p.add_argument("--record-full", action="store_true",
                   help="with --record: keep the data returned to programs, not only digests")
    p.add_argument("--reconnect-grace", type=float, default=5.0, metavar="SECONDS",
                   help="how long a session whose connection dropped waits for its client to "
                        "reconnect before it ends (default 5)")
    add_server_options(p)
    p.add_argument("--mem-limit", type=_size, default=None, metavar="SIZE",
                   help="device memory each session may hold (512M, 4G); cuMemGetInfo "
                        "reports it as the device's size")
    p.add_argument("--server-mem-limit", type=_size, default=None, metavar="SIZE",
                   help="device memory all sessions may hold together (default: the device's)")
    p.add_argument("--max-message", type=_size, default=None, metavar="SIZE",
                   help="the largest message part the server accepts (default 1G)")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _size(text: str) -> int:
    from vgpu.server.peers import parse_size

    try:
        size = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is no room at all")
    return size


def _add_run_parser(sub) -> None:
    p = sub.add_parser("run", help="run a CUDA program through vgpu",
                       usage="vgpu run [--server ADDR] [--backend B] -- CMD [ARGS...]")
    p.add_argument("--server", default=None,
                   help="address of a running vgpu server, or a comma-separated list: the "
                        "first, then standbys to fail over to (default: the user's default "
                        "server when it runs, else a private one started for this run)")
    p.add_argument("--backend", default=None, choices=("auto", "emu", "cuda"),
                   help="start a private server with this backend for this run")
    add_run_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")


def _add_record_parsers(sub) -> None:
    p = sub.add_parser("record", help="run a CUDA program and record its calls in a trace",
                       usage="vgpu record -o TRACE [--full] -- CMD [ARGS...]")
    p.add_argument("-o", "--output", required=True, metavar="TRACE",
                   help="the trace to write: a folder, new or empty")
    p.add_argument("--full", action="store_true",
                   help="keep the data returned to the program too, not only its digests "
                        "(replay --check then shows where results differ)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    p = sub.add_parser("replay", help="run a recorded trace again, without its program")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--check", action="store_true",
                   help="compare every result with the recording's; exit 1 at the first "
                        "difference")
    p.add_argument("--rtol", type=float, default=None, metavar="R",
                   help="with --check: compare data copied back as floats, equal within "
                        "ATOL + R * |recorded| (needs a trace recorded with --full)")
    p.add_argument("--atol", type=float, default=None, metavar="A",
                   help="with --check: the absolute tolerance of that comparison")
    p.add_argument("--floats", default=None, choices=("f32", "f64"),
                   help="with --rtol/--atol: the data's float type (default: f32)")
    p.add_argument("--server", default=None, metavar="ADDR",
                   help="replay on this running server (default: a private one)")
    p.add_argument("--backend", default=None, choices=("auto", "emu", "cuda"),
                   help="the private server's backend (default: emu)")


def _add_ps_parser(sub) -> None:
    p = sub.add_parser("ps", help="list the sessions of running vgpu servers")
    p.add_argument("--server", default=None, help="ask only this server")


def _add_session_parsers(sub) -> None:
    """checkpoint, suspend, resume, migrate: requests about one session."""
    checkpoint = _session_parser(
        sub, "checkpoint", "write a session's checkpoint image while it keeps running")
    checkpoint.add_argument("-o", "--output", default=None, metavar="PATH",
                            help="the image's path (default: the server's checkpoint folder)")
    _session_parser(sub, "suspend",
                    "save a session to its image and free its device memory; its program "
                    "waits until `vgpu resume`")
    resume = _session_parser(sub, "resume", "let a suspended session run again")
    resume.add_argument("--to", default=None, metavar="ADDR",
                        help="restore it on this server instead of the one that suspended it")
    migrate = _session_parser(sub, "migrate",
                              "move a running session to another server; its program goes on")
    migrate.add_argument("--to", required=True, metavar="ADDR", help="the server to move to")
    migrate.add_argument("--stop-and-copy", action="store_true",
                         help="stop the session, then copy its memory (default: copy while it "
                              "runs, then stop it only to send what changed)")


def _session_parser(sub, verb: str, help_text: str):
    p = sub.add_parser(verb, help=help_text, description=help_text)
    p.add_argument("target", type=int, metavar="PID",
                   help="the program's process id (or, with --session, the session id), as "
                        "`vgpu ps` shows")
    p.add_argument("--session", action="store_true", help="PID is a session id")
    p.add_argument("--server", default=None,
                   help="the server that serves the session (default: whichever does)")
    return p


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
    _add_session_parsers(sub)
    _add_record_parsers(sub)
    add_keygen_parser(sub)
    from vgpu.trace_cli import add_trace_parser, trace_command

    add_trace_parser(sub)
    args = parser.parse_args(argv)
    if args.verb is None:  # a usage error, as argparse treats one: help on stderr, status 2
        parser.print_help(sys.stderr)
        return 2
    if args.verb in _SESSION_REQUESTS:
        return _session_request(args)
    if args.verb == "trace":
        return trace_command(args)
    return {"server": _server, "run": _run, "ps": _ps, "record": _record,
            "replay": _replay, "keygen": keygen_command}[args.verb](args)


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

    if args.compile is not None or args.threads:
        from vgpu.server.emu import native
        native.configure(enabled=args.compile, threads=args.threads)
    with contextlib.ExitStack() as turn:
        try:
            check_address(address, listen=True)
            if socket_file is not None:
                turn.enter_context(folder_turn(socket_folder(socket_file, str(runtime_dir()))))
                claim_ipc_socket(socket_file)
            server = ProxyServer(address, args.backend, args.memcheck,
                                 checkpoint_dir=args.checkpoint_dir,
                                 checkpoint_every=args.checkpoint_every,
                                 record_dir=args.record, record_full=args.record_full,
                                 reconnect_grace=args.reconnect_grace,
                                 access=server_access(args, address),
                                 mem_limit=args.mem_limit,
                                 server_mem_limit=args.server_mem_limit,
                                 devices=args.devices,
                                 session_processes=args.session_processes,
                                 **({"max_message": args.max_message}
                                    if args.max_message else {}))
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
    # A tcp server's address carries its key: what its clients and `vgpu ps` connect with.
    endpoint = server_address_with_key(server.endpoint, server.access.public_key)
    announce(endpoint)
    print(f"vgpu server listening on {endpoint} (backend {args.backend})", flush=True)
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
    from vgpu.binary_check import BinaryCheckError, check_executable

    try:
        check_executable(program)
    except BinaryCheckError as exc:  # unreadable or damaged: let the loader have its say
        print(f"vgpu run: warning: {exc}", file=sys.stderr)

    from vgpu.addresses import AddressError, check_address

    if args.insecure:  # for the program's client, and whatever it starts
        os.environ["VGPU_INSECURE"] = "1"
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
        sessions = ask_sessions(address, timeout_s=3)
    except AddressError as exc:
        print(f"vgpu run: warning: ignoring the default server {address}: {exc}",
              file=sys.stderr)
        return None
    if sessions is None:
        print(f"vgpu run: warning: the default server at {address} does not answer; "
              "starting a private one", file=sys.stderr)
        return None
    return address


def _start_private_server(backend: str, options: tuple[str, ...] = ()):
    from vgpu.registry import runtime_dir

    _remove_stale_private_sockets(runtime_dir())
    address = f"ipc://{runtime_dir()}/run-{os.getpid()}-{secrets.token_hex(3)}.sock"
    parent = os.getpid()
    # -P: not the current folder first on sys.path, where a vgpu source tree (the checkout
    # vgpu was installed from) would shadow the installed package.
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "vgpu.cli", "server", "--listen", address, "--backend",
         backend, *options],
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


def _stop(proc: subprocess.Popen, address: str, timeout: float = 10) -> None:
    from vgpu.addresses import ipc_path, remove_socket_file

    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    remove_socket_file(ipc_path(address))  # the server removes it; not if it was killed


def _run_program(command: list[str], address: str) -> int:
    from vgpu.shim.loader import NVRTC, nvidia_nvrtc, shim_library_dir

    env = dict(os.environ)
    lib_dir = shim_library_dir()
    if not env.get("VGPU_NVRTC_LIBRARY"):  # unset: vgpu's libnvrtc then says it is missing
        env.pop("VGPU_NVRTC_LIBRARY", None)
        nvrtc = nvidia_nvrtc(env.get("LD_LIBRARY_PATH", ""))
        if nvrtc is not None:
            env["VGPU_NVRTC_LIBRARY"] = str(nvrtc)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(lib_dir), env.get("LD_LIBRARY_PATH", "")) if p)
    # Preloaded, so that a program looking for a loaded libnvrtc.so.13 before its own copy
    # (cuda-python) finds vgpu's; it loads nothing more until the program calls NVRTC.
    env["LD_PRELOAD"] = " ".join(p for p in (str(lib_dir / NVRTC), env.get("LD_PRELOAD", ""))
                                 if p)
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


# ----------------------------------------------------------------- vgpu record, replay

def _record(args) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("vgpu record: no command given (vgpu record -o TRACE -- CMD [ARGS...])",
              file=sys.stderr)
        return 2
    if shutil.which(command[0]) is None:
        print(f"vgpu record: {command[0]}: command not found", file=sys.stderr)
        return 127
    trace = os.path.abspath(args.output)
    if os.path.exists(trace) and not (os.path.isdir(trace) and not os.listdir(trace)):
        print(f"vgpu record: {trace} exists; a trace goes into a new or empty folder",
              file=sys.stderr)
        return 2
    options = ("--record", trace, *(("--record-full",) if args.full else ()))
    server, address = _start_private_server("emu", options)
    if server is None:
        return 1
    try:
        status = _run_program(command, address)
    finally:
        # Each session writes its trace's manifest as it ends: give the server time to.
        _stop(server, address, timeout=90)
    from vgpu.replay.trace import TraceError, read_trace

    try:
        recorded = read_trace(trace)
    except TraceError as exc:
        print(f"vgpu record: no trace was recorded: {exc}", file=sys.stderr)
        return status or 1
    calls = sum(len(s.calls) for s in recorded.sessions)
    print(f"vgpu record: {_count(len(recorded.sessions), 'session')}, "
          f"{_count(calls, 'call')} recorded in {trace}", file=sys.stderr)
    return status


def _replay(args) -> int:
    from vgpu.replay.replayer import ReplayError, Tolerance, replay
    from vgpu.replay.trace import TraceError, read_trace

    tolerance = None
    if args.rtol is not None or args.atol is not None or args.floats is not None:
        if not args.check:
            print("vgpu replay: --rtol, --atol and --floats say how --check compares",
                  file=sys.stderr)
            return 2
        if args.rtol is None and args.atol is None:
            print("vgpu replay: --floats needs --rtol or --atol", file=sys.stderr)
            return 2
        if min(args.rtol or 0.0, args.atol or 0.0) < 0:
            print("vgpu replay: --rtol and --atol cannot be negative", file=sys.stderr)
            return 2
        tolerance = Tolerance(args.rtol or 0.0, args.atol or 0.0, args.floats or "f32")
    try:
        trace = read_trace(args.trace)  # all of it checked before anything runs
    except TraceError as exc:
        print(f"vgpu replay: {exc}", file=sys.stderr)
        return 2
    if tolerance is not None and not all(s.full for s in trace.sessions):
        print(f"vgpu replay: --rtol/--atol compare the data copied back, and {args.trace} "
              "keeps only their digests (recorded without --full): it can only be checked "
              "for exact equality", file=sys.stderr)
        return 2
    if args.server is not None and args.backend is not None:
        print("vgpu replay: --backend is for a private server; --server names a running one",
              file=sys.stderr)
        return 2
    server, address = None, args.server
    if address is not None:
        from vgpu.addresses import AddressError, check_address

        try:
            check_address(address)
        except AddressError as exc:
            print(f"vgpu replay: --server {address}: {exc}", file=sys.stderr)
            return 2
    else:
        server, address = _start_private_server(args.backend or "emu")
        if server is None:
            return 1
    try:
        difference = replay(trace, address, args.check, tolerance=tolerance)
    except ReplayError as exc:
        print(f"vgpu replay: {exc}", file=sys.stderr)
        return 1
    except TraceError as exc:  # a chunk removed or damaged since it was checked
        print(f"vgpu replay: {exc}", file=sys.stderr)
        return 2
    finally:
        if server is not None:
            _stop(server, address)
    calls = sum(len(s.calls) for s in trace.sessions)
    if difference is not None:
        print(f"vgpu replay: results differ from the recording at\n{difference}",
              file=sys.stderr)
        return 1
    checked = "; every result as recorded" if args.check else ""
    if tolerance is not None:
        checked += (f" (data copied back as {tolerance.floats} within rtol "
                    f"{tolerance.rtol:g}, atol {tolerance.atol:g})")
    print(f"vgpu replay: {_count(len(trace.sessions), 'session')}, "
          f"{_count(calls, 'call')} replayed{checked}")
    return 0


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
            sessions = ask_sessions(address, timeout_s=3)
        except AddressError as exc:
            print(f"vgpu ps: {address}: {exc}", file=sys.stderr)
            status = 1
            continue
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
    # A session in a device process of its own shows that process's pid by its backend.
    print(f"  {'PID':>8}  {'SESSION':>7}  {'BACKEND':12}  {'MEMORY':>10}  {'CALLS':>8}  "
          f"{'QUEUED':>6}  {'STATE':9}  {'TOKEN':8}  {'CHECKPOINT':19}  {'COPY':20}  COMMAND")
    now = time.time()
    for s in sessions:
        command = " ".join(s["command"].split())  # one row per session, whatever argv holds
        backend = s["backend"] + (f"@{s['device_pid']}" if s.get("device_pid") else "")
        print(f"  {s['pid']:>8}  {s.get('session', '-'):>7}  {backend:12}  "
              f"{_human(s['memory']):>10}  {s['calls']:>8}  {s.get('queued', 0):>6}  "
              f"{s.get('state') or '-':9}  {(s.get('token') or '-')[:8]:8}  "
              f"{_checkpoint_column(s.get('checkpoint'), now):19}  "
              f"{_copy_column(s.get('copy')):20}  {command}")


def _copy_column(copy: dict | None) -> str:
    """The large copy streaming over the network: its direction, bytes done and total."""
    if not copy:
        return "-"
    return f"{copy['direction']} {_human(copy['done'])}/{_human(copy['total'])}"


def _checkpoint_column(checkpoint: dict | None, now: float) -> str:
    """The session's last checkpoint: how long ago, and its image's size."""
    if not checkpoint:
        return "-"
    return f"{_age(now - checkpoint['at'])} ago, {_human(checkpoint['bytes'])}"


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ----------------------------------------------------------------- checkpoint, suspend, ...

class _Refused(Exception):
    """A session request that cannot be made: the message for stderr, and the exit status."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def _session_request(args) -> int:
    verb = args.verb
    try:
        selector = {"session": args.target} if args.session else {"pid": args.target}
        extra = _SESSION_REQUESTS[verb].arguments(args)
        address, row = _find_session(args.server, selector)
        with _ProgressBars(sys.stderr) as bars:
            reply = _admin_request(address, verb, [{**selector, **extra}], bars.update)
        try:
            line = _SESSION_REQUESTS[verb].describe(_who(selector, row), extra, reply)
        except (KeyError, TypeError, ValueError):
            raise _Refused(f"unexpected answer from {address}: {reply!r:.200}") from None
    except _Refused as exc:
        print(f"vgpu {verb}: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        print(f"vgpu {verb}: interrupted (a request already sent goes on at the server)",
              file=sys.stderr)
        return 130
    print(line)
    return 0


def _admin_request(address: str, op: str, args: list, progress):
    from vgpu.admin import AdminError, request

    try:
        return request(address, op, args, progress)
    except AdminError as exc:
        raise _Refused(str(exc)) from None


def _find_session(server: str | None, selector: dict) -> tuple[str, dict | None]:
    """The address of the server that serves the session, and its `ps` row. A server named
    with --server is asked even if its list lacks the session: its answer then says why."""
    from vgpu.addresses import AddressError, check_address
    from vgpu.registry import live_servers

    if server is not None:
        try:
            check_address(server)
        except AddressError as exc:
            raise _Refused(f"--server {server}: {exc}", 2) from None
        return server, _matching(_sessions_of(server, quiet=False), selector)
    servers = live_servers()
    if not servers:
        raise _Refused("no vgpu server is running")
    found = [(address, row) for _, address in servers
             if (row := _matching(_sessions_of(address, quiet=True), selector)) is not None]
    what = " ".join(f"{key} {value}" for key, value in selector.items())
    if not found:
        raise _Refused(f"no {what} on any running vgpu server (see vgpu ps)")
    if len(found) > 1:
        raise _Refused(f"{what} is on several servers ({', '.join(a for a, _ in found)}); "
                       "name one with --server", 2)
    return found[0]


def _sessions_of(address: str, quiet: bool) -> list[dict]:
    """The server's sessions; with quiet, none for a server that is not there or does not
    answer (one of several looked through), else the error `vgpu ps` gives."""
    from vgpu.addresses import AddressError, ipc_path, listener_pid
    from vgpu.registry import ask_sessions

    try:
        socket_file = ipc_path(address)
        if socket_file is not None and listener_pid(socket_file) is None:
            if quiet:
                return []
            raise _Refused(f"no vgpu server at {address}")
        sessions = ask_sessions(address, timeout_s=3)
    except AddressError as exc:
        if quiet:
            return []
        raise _Refused(f"{address}: {exc}") from None
    if sessions is None:
        if quiet:
            return []
        raise _Refused(f"no answer from {address}")
    return sessions


def _matching(sessions: list[dict], selector: dict) -> dict | None:
    (key, value), = selector.items()
    return next((s for s in sessions if isinstance(s, dict) and s.get(key) == value), None)


def _who(selector: dict, row: dict | None) -> str:
    if row is not None and "session" in row:
        return f"session {row['session']} (pid {row['pid']})"
    (key, value), = selector.items()
    return f"{key} {value}"


class _ProgressBars:
    """The server's progress notices as tqdm bars on stderr, one per phase (and per round of
    a migration), on a terminal only: a log or a pipe gets the result line alone."""

    _LABELS = {"copy": "copying", "write": "writing", "read": "reading", "send": "sending"}

    def __init__(self, stream):
        self.stream = stream
        self.shown = stream.isatty()
        self.bar = None
        self.key = None

    def update(self, phase: str, done: int, total: int) -> None:
        if not self.shown:
            return
        if self.bar is None or self.key != (phase, total):
            from tqdm import tqdm

            self.close()
            self.bar = tqdm(total=total, desc=self._LABELS.get(phase, phase), unit="B",
                            unit_scale=True, unit_divisor=1024, file=self.stream, leave=False)
            self.key = (phase, total)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Request:
    """What a session verb adds to its request, and its result line."""

    def __init__(self, arguments, describe):
        self.arguments = arguments
        self.describe = describe


def _checkpoint_arguments(args) -> dict:
    # The server resolves a relative path against its own folder, not the user's.
    return {"path": os.path.abspath(args.output) if args.output else None}


def _resume_arguments(args) -> dict:
    return {"to": _target_address(args.to)}


def _migrate_arguments(args) -> dict:
    return {"to": _target_address(args.to), "precopy": not args.stop_and_copy}


def _target_address(address: str | None) -> str | None:
    from vgpu.addresses import AddressError, check_address

    if address is not None:
        try:
            check_address(address)
        except AddressError as exc:
            raise _Refused(f"--to {address}: {exc}", 2) from None
    return address


# The result lines: `who` names the session, `asked` is what the request added to the
# selector, `r` the server's answer.

def _describe_checkpoint(who: str, asked: dict, r: dict) -> str:
    shared = r["shared_chunks"]
    return (f"checkpointed {who} to {r['path']}: {_human(r.get('memory', r['bytes']))} in "
            f"{_count(r['chunks'], 'chunk')}, wrote {_human(r['written'])} ({shared} shared), "
            f"session stopped {r['stop_s']:.2f} s")


def _describe_suspend(who: str, asked: dict, r: dict) -> str:
    return (f"suspended {who} to {r['path']} ({_human(r['bytes'])}), session stopped "
            f"{r['stop_s']:.2f} s")


def _describe_resume(who: str, asked: dict, r: dict) -> str:
    if r.get("moved_to"):
        return (f"resumed {who} on {r['moved_to']}: sent {_human(r['bytes_sent'])} in "
                f"{r['total_s']:.2f} s")
    return f"resumed {who}: restored in {r['restore_s']:.2f} s"


def _describe_migrate(who: str, asked: dict, r: dict) -> str:
    return (f"migrated {who} to {asked['to']}: sent {_human(r['bytes_sent'])} in "
            f"{_count(r['rounds'], 'round')}, "
            f"{r['total_s']:.2f} s; downtime {r['downtime_s']:.2f} s")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


_SESSION_REQUESTS = {
    "checkpoint": _Request(_checkpoint_arguments, _describe_checkpoint),
    "suspend": _Request(lambda args: {}, _describe_suspend),
    "resume": _Request(_resume_arguments, _describe_resume),
    "migrate": _Request(_migrate_arguments, _describe_migrate),
}


if __name__ == "__main__":
    sys.exit(main())
