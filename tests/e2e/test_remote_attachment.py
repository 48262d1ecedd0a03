"""Programs on one host using the device of a server on another, over tcp, encrypted and
authenticated (CurveZMQ), set up as a user does it: `vgpu keygen` on each side, the
client's public key in the server's authorized-keys folder, the server's key given with its
address. Where the machine allows it (root, `ip netns`) server and client run in network
namespaces of their own, joined by a veth pair; on loopback otherwise."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from vgpu_processes import ServerProcess, keygen, run_under_vgpu, vgpu_environment

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUNTIME_PROGRAMS = Path(__file__).resolve().parents[1] / "runtime" / "programs"
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def homes(tmp_path_factory):
    """VGPU_HOME of the server's user, of an admitted client (alice) and of a client the
    server does not know (mallory)."""
    root = tmp_path_factory.mktemp("homes")
    server, alice, mallory = root / "server", root / "alice", root / "mallory"
    keygen(server, "--server")
    keygen(alice)
    keygen(mallory)
    (server / "authorized-keys").mkdir()
    shutil.copy(alice / "client.pub", server / "authorized-keys" / "alice.key")
    return {"server": server, "alice": alice, "mallory": mallory}


def _namespaces_work() -> bool:
    if os.getuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"vgpu-probe-{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return made


@contextlib.contextmanager
def _two_namespaces():
    """Two network namespaces joined by a veth pair: (server's command prefix, client's,
    the server's address)."""
    tag = secrets.token_hex(3)
    server_ns, client_ns = f"vgpu-s-{tag}", f"vgpu-c-{tag}"
    steps = [["ip", "netns", "add", server_ns], ["ip", "netns", "add", client_ns],
             ["ip", "link", "add", f"vs{tag}", "type", "veth", "peer", "name", f"vc{tag}"],
             ["ip", "link", "set", f"vs{tag}", "netns", server_ns],
             ["ip", "link", "set", f"vc{tag}", "netns", client_ns]]
    for ns, dev, ip in ((server_ns, f"vs{tag}", "10.213.7.1"), (client_ns, f"vc{tag}",
                                                                  "10.213.7.2")):
        steps += [["ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", dev],
                  ["ip", "-n", ns, "link", "set", dev, "up"],
                  ["ip", "-n", ns, "link", "set", "lo", "up"]]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        yield ("ip", "netns", "exec", server_ns), ("ip", "netns", "exec", client_ns), \
            "10.213.7.1"
    finally:
        for ns in (server_ns, client_ns):  # deleting a namespace deletes its veth end
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture(scope="module")
def network():
    """(server's command prefix, client's, the server's host): separate network namespaces
    where the machine allows, else loopback."""
    if _namespaces_work():
        with _two_namespaces() as net:
            yield net
    else:
        yield (), (), "127.0.0.1"


@pytest.fixture(scope="module")
def remote(homes, network):
    """An emu server listening on tcp in the server's namespace, as its user runs it; yields
    (its address with its key, the client's command prefix, the server)."""
    server_prefix, client_prefix, host = network
    server = ServerProcess(f"tcp://{host}:*", "-v", prefix=server_prefix,
                           env=vgpu_environment(VGPU_HOME=str(homes["server"])))
    yield server.address, client_prefix, server
    server.stop()


def _run(remote, home: Path, program, *args, address: str | None = None, **env):
    address_with_key, prefix, _ = remote
    return run_under_vgpu(address or address_with_key, program, *args, timeout=TIMEOUT_S,
                          prefix=prefix, VGPU_HOME=str(home), **env)


def _passed(result, line: str) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert line in result.stdout, result.stdout + result.stderr


def test_the_server_prints_its_address_with_its_key(remote, homes):
    address, _, _ = remote
    public = (homes["server"] / "server.pub").read_text().strip()
    assert address.startswith("tcp://") and address.endswith(f"#serverkey={public}")


def test_a_driver_api_program_runs_remotely(remote, homes, driver_app, kernels_ptx):
    _passed(_run(remote, homes["alice"], driver_app, kernels_ptx),
            "driver_app: all results correct")


def test_a_runtime_api_program_runs_remotely(remote, homes, toolkit):
    program = toolkit.executable((RUNTIME_PROGRAMS / "vector_add.cu").read_text(),
                                 ["-cudart", "shared", f"-I{RUNTIME_PROGRAMS}"])
    _passed(_run(remote, homes["alice"], program), "vector_add: 1000 sums correct")


def test_managed_memory_works_remotely(remote, homes, toolkit):
    """The host's view of managed memory and the server's copy agree over the network too,
    a 3 MiB allocation (streamed in chunks) among them."""
    program = toolkit.executable((RUNTIME_PROGRAMS / "managed_memory.cu").read_text(),
                                 ["-cudart", "shared", f"-I{RUNTIME_PROGRAMS}"])
    result = _run(remote, homes["alice"], program)
    _passed(result, "managed_memory: __managed__ variables shared by host and device")
    _passed(result, "managed_memory: copies, memsets and a 3 MiB allocation correct")
    _passed(result, "managed_memory: misuse refused with CUDA's errors")


def test_a_cuda_python_program_runs_remotely_with_the_key_in_known_servers(remote, homes,
                                                                          tmp_path):
    address, _, _ = remote
    plain, _, key = address.partition("#serverkey=")
    home = tmp_path / "alice"
    shutil.copytree(homes["alice"], home)
    (home / "known-servers").write_text(f"# servers this user trusts\n{plain} {key}\n")
    result = _run(remote, home, sys.executable, EXAMPLES / "vector_add.py", address=plain)
    _passed(result, "correct")


def test_the_server_knows_its_clients_by_their_keys(homes, network, driver_app, kernels_ptx):
    server_prefix, client_prefix, host = network
    server = ServerProcess(f"tcp://{host}:*", "-v", prefix=server_prefix,
                           env=vgpu_environment(VGPU_HOME=str(homes["server"])))
    try:
        _passed(_run((server.address, client_prefix, server), homes["alice"], driver_app,
                     kernels_ptx), "driver_app: all results correct")
    finally:
        log = server.stop()
    assert "opened for key alice" in log, log
    # It offered no shared memory: a remote client does not ask for any.
    assert "opened for uid" not in log and "shared staging memory" not in log, log


def test_an_unknown_client_key_is_refused_with_a_clear_message(remote, homes, driver_app,
                                                               kernels_ptx):
    result = _run(remote, homes["mallory"], driver_app, kernels_ptx)
    assert result.returncode != 0
    assert "did not accept this client's key" in result.stderr, result.stderr
    assert "authorized-keys" in result.stderr


def test_a_default_server_refuses_a_plain_tcp_client(remote, homes, driver_app, kernels_ptx):
    address, _, _ = remote
    result = _run(remote, homes["alice"], driver_app, kernels_ptx,
                  address=address.partition("#")[0], VGPU_INSECURE="1")
    assert result.returncode != 0
    assert "without encryption" in result.stderr  # the client's warning
    assert "requires encryption (CurveZMQ)" in result.stderr, result.stderr


def test_a_client_refuses_a_server_whose_key_it_does_not_know(remote, homes, driver_app,
                                                              kernels_ptx):
    address, _, _ = remote
    result = _run(remote, homes["alice"], driver_app, kernels_ptx,
                  address=address.partition("#")[0])
    assert result.returncode != 0
    assert "the key of the server at" in result.stderr and "is unknown" in result.stderr


def test_a_client_refuses_a_server_that_does_not_hold_the_key_given(remote, homes, driver_app,
                                                                    kernels_ptx):
    address, _, _ = remote
    other = (homes["mallory"] / "client.pub").read_text().strip()  # any other key
    result = _run(remote, homes["alice"], driver_app, kernels_ptx,
                  address=f"{address.partition('#')[0]}#serverkey={other}")
    assert result.returncode != 0
    assert "does not hold the key this client expects" in result.stderr, result.stderr
