"""Who may ask a server what about its sessions: an admin (the server's own user or root on
its host, or a key whose authorized-keys entry says `admin`) everything; any other client
sees and acts on its own sessions only, and never makes the server write where it says or
connect where it says."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from vgpu_processes import VGPU, start_emu_server, stop_server, vgpu_environment

from vgpu.admin import AdminError, request
from vgpu.client import Connection

CONTEXT = 7


def _key(home, name: str) -> tuple[str, str]:
    """A client key pair made with `vgpu keygen`: (its secret file, its public key)."""
    folder = home / name
    subprocess.run([*VGPU, "keygen", "--dir", str(folder)], check=True, capture_output=True,
                   env=vgpu_environment())
    return str(folder / "client.secret"), (folder / "client.pub").read_text().strip()


@pytest.fixture
def keyed_server(tmp_path, monkeypatch):
    """A tcp server admitting alice and bob (plain clients) and ops (an admin); yields its
    address and a function that makes the caller one of them (VGPU_CLIENT_KEY)."""
    home = tmp_path / "server"
    subprocess.run([*VGPU, "keygen", "--server"], check=True, capture_output=True,
                   env=vgpu_environment(VGPU_HOME=str(home)))
    (home / "authorized-keys").mkdir()
    secrets = {}
    for name, options in (("alice", ""), ("bob", " sessions=4"), ("ops", " admin")):
        secrets[name], public = _key(tmp_path, name)
        (home / "authorized-keys" / f"{name}.key").write_text(f"{public}{options}\n")
    proc = start_emu_server("tcp://127.0.0.1:*", env=vgpu_environment(VGPU_HOME=str(home)))

    def be(name: str) -> None:
        monkeypatch.setenv("VGPU_CLIENT_KEY", secrets[name])

    yield proc.endpoint, be
    stop_server(proc)


def _ask(address: str, op: str, **args):
    try:
        return request(address, op, [args] if args else [], timeout_s=30)
    except AdminError as exc:
        return str(exc)


def _session_of(be, name: str, address: str) -> Connection:
    be(name)
    conn = Connection(address, timeout=30)
    conn.post("cuDevicePrimaryCtxRetain", CONTEXT, 0)
    conn.call("cuMemAlloc", CONTEXT, 4096)
    return conn


def test_a_client_sees_and_acts_on_its_own_sessions_only(keyed_server, tmp_path):
    address, be = keyed_server
    alice, bob = _session_of(be, "alice", address), _session_of(be, "bob", address)
    be("ops")
    every = {row["peer"]: row["session"] for row in _ask(address, "ps")}
    assert set(every) == {"key alice", "key bob"}
    be("alice")
    assert [row["peer"] for row in _ask(address, "ps")] == ["key alice"]
    assert _ask(address, "suspend", session=every["key bob"]) == \
        f"no session with session {every['key bob']} on this server"
    assert _ask(address, "suspend", session=every["key alice"])["path"]
    assert "resumed" not in str(_ask(address, "resume", session=every["key alice"]))
    alice.call("cuMemAlloc", CONTEXT, 4096)  # it goes on after its resume
    image = tmp_path / "alice.vgpu"
    assert "may not write an image where it names" in \
        _ask(address, "checkpoint", session=every["key alice"], path=str(image))
    assert "may not move sessions" in \
        _ask(address, "migrate", session=every["key alice"], to="tcp://127.0.0.1:1")
    assert "may not hand sessions to this server" in \
        _ask(address, "adopt", token="0" * 32, phase="begin")
    assert not image.exists()
    be("ops")
    assert _ask(address, "checkpoint", session=every["key bob"], path=str(image))["path"]
    assert image.exists()
    alice.close()
    bob.close()


def test_another_local_user_is_refused_even_where_the_socket_lets_it_in():
    """Over ipc the server asks the kernel who connected: a user that is neither the
    server's nor root is refused, even when the socket's permissions would let it through
    (the socket and its folder are owner-only as the server makes them)."""
    if os.getuid() != 0:
        pytest.skip("becoming another user needs root")
    folder = Path(tempfile.mkdtemp(prefix="vgpu-open-"))
    address = f"ipc://{folder}/server.sock"
    proc = start_emu_server(address)
    try:
        assert os.stat(folder / "server.sock").st_mode & 0o777 == 0o600
        for path in (folder, folder / "server.sock"):
            os.chmod(path, 0o777)  # as an administrator's mistake would
        assert "did not accept this client's user" in _connect_as_nobody(address)
    finally:
        stop_server(proc)
        shutil.rmtree(folder)


def test_a_group_opens_a_local_server_to_its_members(tmp_path):
    """`--group users`: the socket and its folder become the group's, and a member of it is
    served (through message frames: its files are its own); others still are not."""
    if os.getuid() != 0:
        pytest.skip("becoming another user needs root")
    folder = Path(tempfile.mkdtemp(prefix="vgpu-group-"))
    os.chmod(folder, 0o700)
    address = f"ipc://{folder}/server.sock"
    proc = start_emu_server(address, "--group", "users")
    try:
        socket_file = os.stat(folder / "server.sock")
        assert (socket_file.st_gid, socket_file.st_mode & 0o777) == (100, 0o660)
        assert (os.stat(folder).st_gid, os.stat(folder).st_mode & 0o777) == (100, 0o710)
        assert _connect_as_nobody(address, gid=100) == "admitted"
        os.chmod(folder, 0o711)  # as an administrator's mistake would
        os.chmod(folder / "server.sock", 0o666)
        assert "did not accept this client's user" in _connect_as_nobody(address, gid=65534)
    finally:
        stop_server(proc)
        shutil.rmtree(folder)


def _connect_as_nobody(address: str, gid: int = 65534) -> str:
    """What a client of user nobody (group `gid`) hears from the server at `address`.

    The client is a child of a fork server (multiprocessing's): forked from a process that
    has no threads, as forking this one (whose earlier tests leave threads) could copy a
    lock another thread holds and hang; and forked, not started, because user nobody may
    not run this interpreter."""
    context = multiprocessing.get_context("forkserver")
    heard, said = context.Pipe(duplex=False)
    child = context.Process(target=_client_as_nobody, args=(address, gid, said))
    child.start()
    said.close()
    try:
        if not heard.poll(60):
            raise AssertionError(f"a client of user nobody said nothing about {address} "
                                 "within 60 s")
        return heard.recv()
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()


def _client_as_nobody(address: str, gid: int, said) -> None:  # pragma: no cover (child)
    import zmq.utils.monitor  # noqa: F401 (nobody cannot read this interpreter's library)

    from vgpu.errors import DeviceUnavailable

    try:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(65534)
        Connection(address, timeout=10).close()
        said.send("admitted")
    except DeviceUnavailable as exc:
        said.send(str(exc))
    except BaseException as exc:
        said.send(repr(exc))
