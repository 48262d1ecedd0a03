"""`vgpu checkpoint`, `suspend`, `resume`, `migrate` and `vgpu ps`'s state columns, as the
command itself behaves: the request it sends, the line it prints from the answer, its
errors, and progress bars on a terminal only. The server here is a stand-in that answers
as the protocol says; the commands against a real server are tested with the server."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import tempfile
import termios
import threading
import time

import pytest
import zmq
from e2e_support import VGPU

from vgpu import cli, registry
from vgpu.protocol import pack, unpack

CHECKPOINTED = {"path": "/ckpt/a.vgpu", "bytes": 1 << 30, "memory": 1 << 30,
                "written": int(12.3 * 2**20), "chunks": 812, "shared_chunks": 805,
                "stop_s": 0.08, "total_s": 1.5, "position": 40}
SESSION = {"session": 3, "pid": 1234, "host": "h", "command": "python train.py",
           "backend": "emu", "memory": 1 << 30, "calls": 40, "queued": 0, "since": 0.0,
           "state": "running", "token": "3f2a9c1e", "checkpoint": None}


class StandIn:
    """A zmq ROUTER answering ADMIN requests: `ps` with `sessions`, any other op with the
    headers `answers[op]` gives ([seq, code, result]; seq None: the request's own)."""

    def __init__(self, address: str, sessions: list[dict], answers: dict[str, list]):
        self.address, self.sessions, self.answers = address, sessions, answers
        self.requests: list = []
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.bind(address)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            if not self.sock.poll(50):
                continue
            identity, header = self.sock.recv_multipart()
            _, seq, (op, args) = unpack(header)
            if op == "ps":
                self._send(identity, [seq, 0, self.sessions])
                continue
            self.requests.append([op, args])
            for reply_seq, code, result in self.answers.get(op, []):
                self._send(identity, [seq if reply_seq is None else reply_seq, code, result])

    def _send(self, identity: bytes, head: list) -> None:
        self.sock.send_multipart([identity, pack([*head, 0, "", ""])])

    def close(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.sock.close()
        self.ctx.term()


@pytest.fixture
def folder():
    # Short: an ipc socket's path must fit in 107 bytes.
    with tempfile.TemporaryDirectory(prefix="vgpu-cli-") as path:
        yield path


@pytest.fixture
def serve(folder, monkeypatch):
    """Start a stand-in server that `vgpu` finds as the only running one."""
    started = []

    def start(answers: dict[str, list], sessions=(SESSION,)) -> StandIn:
        server = StandIn(f"ipc://{folder}/s{len(started)}.sock", list(sessions), answers)
        started.append(server)
        monkeypatch.setattr(registry, "live_servers",
                            lambda: [(os.getpid(), s.address) for s in started])
        return server

    yield start
    for server in started:
        server.close()


def vgpu(capsys, *args: str) -> tuple[int, str, str]:
    status = cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def progress(phase: str, done: int, total: int) -> list:
    return [0, 0, {"progress": [phase, done, total]}]


def test_checkpoint_asks_the_server_of_the_pid_and_prints_one_line(serve, capsys, tmp_path,
                                                                   monkeypatch):
    server = serve({"checkpoint": [progress("write", 1, 2), progress("write", 2, 2),
                                   [None, 0, CHECKPOINTED]]})
    monkeypatch.chdir(tmp_path)
    assert vgpu(capsys, "checkpoint", "1234", "-o", "ckpt/a.vgpu") == (
        0, "checkpointed session 3 (pid 1234) to /ckpt/a.vgpu: 1.0 GiB in 812 chunks, wrote "
           "12.3 MiB (805 shared), session stopped 0.08 s\n",
        "")  # stderr is no terminal: no progress bar
    # The path is the user's, made absolute: the server's folder is not the user's.
    assert server.requests == [["checkpoint", [{"pid": 1234,
                                                "path": str(tmp_path / "ckpt/a.vgpu")}]]]


def test_checkpoint_by_session_id_into_the_servers_folder(serve, capsys):
    server = serve({"checkpoint": [[None, 0, CHECKPOINTED]]})
    status, out, _ = vgpu(capsys, "checkpoint", "--session", "3")
    assert status == 0 and out.startswith("checkpointed session 3 (pid 1234) to ")
    assert server.requests == [["checkpoint", [{"session": 3, "path": None}]]]


def test_suspend_resume_and_migrate_send_their_requests(serve, capsys):
    server = serve({
        "suspend": [[None, 0, {"path": "/ckpt/a.vgpu", "bytes": 3 << 20, "stop_s": 0.25}]],
        "resume": [[None, 0, {"restore_s": 0.5}]],
        "migrate": [progress("copy", 5, 10), progress("send", 10, 10),
                    [None, 0, {"downtime_s": 0.04, "rounds": 3, "bytes_sent": 5 << 30,
                               "total_s": 9.5}]],
    })
    assert vgpu(capsys, "suspend", "1234")[:2] == (
        0, "suspended session 3 (pid 1234) to /ckpt/a.vgpu (3.0 MiB), session stopped "
           "0.25 s\n")
    assert vgpu(capsys, "resume", "1234")[:2] == (
        0, "resumed session 3 (pid 1234): restored in 0.50 s\n")
    assert vgpu(capsys, "migrate", "1234", "--to", "tcp://10.0.0.2:5555")[:2] == (
        0, "migrated session 3 (pid 1234) to tcp://10.0.0.2:5555: sent 5.0 GiB in 3 rounds, "
           "9.50 s; downtime 0.04 s\n")
    vgpu(capsys, "migrate", "1234", "--to", "tcp://10.0.0.2:5555", "--stop-and-copy")
    assert server.requests == [
        ["suspend", [{"pid": 1234}]],
        ["resume", [{"pid": 1234, "to": None}]],
        ["migrate", [{"pid": 1234, "to": "tcp://10.0.0.2:5555", "precopy": True}]],
        ["migrate", [{"pid": 1234, "to": "tcp://10.0.0.2:5555", "precopy": False}]],
    ]


def test_resume_on_another_server_says_where(serve, capsys):
    server = serve({"resume": [[None, 0, {"moved_to": "tcp://10.0.0.2:5555",
                                          "bytes_sent": 3 << 20, "total_s": 0.75}]]})
    assert vgpu(capsys, "resume", "1234", "--to", "tcp://10.0.0.2:5555")[:2] == (
        0, "resumed session 3 (pid 1234) on tcp://10.0.0.2:5555: sent 3.0 MiB in 0.75 s\n")
    assert server.requests == [["resume", [{"pid": 1234, "to": "tcp://10.0.0.2:5555"}]]]


def test_a_refusal_is_the_servers_message_on_one_line(serve, capsys):
    serve({"checkpoint": [[None, 1, "cannot write checkpoint /ro/a.vgpu: Read-only file "
                                    "system; no checkpoint was written"]]})
    assert vgpu(capsys, "checkpoint", "1234", "-o", "/ro/a.vgpu") == (
        1, "", "vgpu checkpoint: cannot write checkpoint /ro/a.vgpu: Read-only file system; "
               "no checkpoint was written\n")


def test_a_named_server_is_asked_even_without_the_session_in_its_list(serve, capsys):
    server = serve({"suspend": [[None, 1, "no session with pid 99"]]})
    assert vgpu(capsys, "suspend", "99", "--server", server.address) == (
        1, "", "vgpu suspend: no session with pid 99\n")
    assert server.requests == [["suspend", [{"pid": 99}]]]


def test_a_pid_no_server_serves_is_a_clear_error(serve, capsys):
    server = serve({})
    assert vgpu(capsys, "checkpoint", "99") == (
        1, "", "vgpu checkpoint: no pid 99 on any running vgpu server (see vgpu ps)\n")
    assert server.requests == []


def test_a_session_id_two_servers_have_needs_server(serve, capsys):
    first, second = serve({}), serve({})
    status, out, err = vgpu(capsys, "checkpoint", "--session", "3")
    assert (status, out) == (2, "")
    assert err == (f"vgpu checkpoint: session 3 is on several servers ({first.address}, "
                   f"{second.address}); name one with --server\n")


def test_without_a_server_the_commands_say_so(capsys, folder, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", folder)  # no server announced there
    for args in (["checkpoint", "1"], ["suspend", "1"], ["resume", "1"],
                 ["migrate", "1", "--to", "tcp://127.0.0.1:5555"]):
        assert vgpu(capsys, *args) == (1, "", f"vgpu {args[0]}: no vgpu server is running\n")
    nobody = f"ipc://{folder}/nobody.sock"
    assert vgpu(capsys, "checkpoint", "1", "--server", nobody) == (
        1, "", f"vgpu checkpoint: no vgpu server at {nobody}\n")


@pytest.mark.parametrize("args, message", [
    (["checkpoint", "--server", "bogus", "1"], "vgpu checkpoint: --server bogus: not a server "
                                               "address"),
    (["migrate", "1", "--to", "bogus"], "vgpu migrate: --to bogus: not a server address"),
    (["resume", "1", "--to", "tcp://127.0.0.1:99999"], "'99999' is not a port number"),
])
def test_a_bad_address_is_a_usage_error(capsys, args, message):
    status, out, err = vgpu(capsys, *args)
    assert (status, out) == (2, "")
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("args", [["checkpoint"], ["checkpoint", "abc"], ["migrate", "1"],
                                  ["suspend", "1", "-o", "x"]])
def test_malformed_arguments_are_argparse_errors(capsys, args):
    with pytest.raises(SystemExit) as stopped:
        cli.main(args)
    assert stopped.value.code == 2
    assert "usage: vgpu " in capsys.readouterr().err


def test_a_server_that_stops_meanwhile_or_falls_silent(serve, capsys, monkeypatch):
    server = serve({"checkpoint": [progress("write", 1, 2),
                                   [0, 46, "the server is shutting down"]]})
    assert vgpu(capsys, "checkpoint", "1234") == (
        1, "", f"vgpu checkpoint: the server at {server.address} stopped: the server is "
               "shutting down\n")
    monkeypatch.setenv("VGPU_TIMEOUT", "0.3")
    assert vgpu(capsys, "suspend", "1234") == (
        1, "", f"vgpu suspend: no answer from {server.address} in 0.3 s\n")


def test_an_answer_that_is_not_what_was_asked_for_is_an_error(serve, capsys):
    server = serve({"checkpoint": [[None, 0, {"path": "/x"}]]})
    assert vgpu(capsys, "checkpoint", "1234") == (
        1, "", f"vgpu checkpoint: unexpected answer from {server.address}: {{'path': '/x'}}\n")


def test_progress_bars_appear_on_a_terminal(serve):
    server = serve({"checkpoint": [progress("write", 1 << 20, 4 << 20),
                                   progress("write", 4 << 20, 4 << 20),
                                   [None, 0, CHECKPOINTED]]})
    terminal, other_end = pty.openpty()
    # A terminal 100 columns wide (a new pseudo-terminal has none, and tqdm draws to fit).
    fcntl.ioctl(other_end, termios.TIOCSWINSZ, struct.pack("4H", 24, 100, 0, 0))
    try:
        result = subprocess.run(
            [*VGPU, "checkpoint", "1234", "--server", server.address], stdout=subprocess.PIPE,
            stderr=other_end, text=True, timeout=60)
        os.close(other_end)
        other_end = None
        shown = b""
        while True:
            try:
                chunk = os.read(terminal, 65536)
            except OSError:  # EIO: the other end is closed and everything was read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(terminal)
        if other_end is not None:
            os.close(other_end)
    assert result.returncode == 0
    assert result.stdout.startswith("checkpointed session 3 (pid 1234) to /ckpt/a.vgpu")
    assert b"writing" in shown and b"4.00M" in shown, shown


def test_ps_shows_state_token_and_last_checkpoint(serve, capsys):
    checkpointed = {**SESSION, "session": 4, "pid": 4321, "state": "suspended",
                    "token": "0123456789abcdef",
                    "checkpoint": {"path": "/ckpt/b.vgpu", "at": time.time() - 7300,
                                   "bytes": 3 << 20, "written": 1 << 20}}
    server = serve({}, sessions=[SESSION, checkpointed])
    status, out, _ = vgpu(capsys, "ps", "--server", server.address)
    assert status == 0
    header, first, second = out.splitlines()[1:]
    assert header.split() == ["PID", "SESSION", "BACKEND", "MEMORY", "CALLS", "QUEUED", "STATE",
                              "TOKEN", "CHECKPOINT", "COPY", "COMMAND"]
    assert first.split() == ["1234", "3", "emu", "1.0", "GiB", "40", "0", "running",
                             "3f2a9c1e", "-", "-", "python", "train.py"]
    assert second.split() == ["4321", "4", "emu", "1.0", "GiB", "40", "0", "suspended",
                              "01234567", "2h", "ago,", "3.0", "MiB", "-", "python", "train.py"]


@pytest.mark.parametrize("seconds, shown", [(0, "0s"), (59, "59s"), (61, "1m"),
                                            (3 * 3600 + 5, "3h"), (2 * 86400, "2d")])
def test_ages_are_in_the_largest_unit(seconds, shown):
    assert cli._age(seconds) == shown

