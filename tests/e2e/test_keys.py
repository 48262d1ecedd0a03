"""Keys as a user handles them: `vgpu keygen`, the authorized-keys entries a server reads, and
what vgpu says about keys it cannot use."""

from __future__ import annotations

import os
import stat
import subprocess

from vgpu_processes import VGPU, vgpu_environment

from vgpu.server.peers import read_authorized_keys


def _vgpu(home, *args) -> subprocess.CompletedProcess:
    return subprocess.run([*VGPU, *args], capture_output=True, text=True, timeout=60,
                          env=vgpu_environment(VGPU_HOME=str(home)))


def test_keygen_makes_an_owner_only_key_pair_and_keeps_an_existing_one(tmp_path):
    home = tmp_path / "home"
    made = _vgpu(home, "keygen")
    assert made.returncode == 0, made.stderr
    public = (home / "client.pub").read_text().strip()
    assert made.stdout.splitlines()[1] == public and len(public) == 40
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(home / "client.secret").st_mode) == 0o600
    again = _vgpu(home, "keygen")
    assert again.returncode == 1 and "exists" in again.stderr and "--force" in again.stderr
    assert (home / "client.pub").read_text().strip() == public
    assert _vgpu(home, "keygen", "--force").returncode == 0
    assert (home / "client.pub").read_text().strip() != public


def test_a_secret_key_others_can_read_is_refused(tmp_path):
    home = tmp_path / "home"
    assert _vgpu(home, "keygen").returncode == 0
    os.chmod(home / "client.secret", 0o644)
    result = _vgpu(home, "ps", "--server", "tcp://127.0.0.1:9#serverkey=" + "0" * 40)
    assert result.returncode == 1
    assert "is readable by others (mode 644): chmod 600 it" in result.stderr, result.stderr


def test_a_tcp_server_without_its_key_or_authorized_keys_says_what_is_missing(tmp_path):
    home = tmp_path / "home"
    result = _vgpu(home, "server", "--listen", "tcp://127.0.0.1:*", "--backend", "emu")
    assert result.returncode == 1
    assert "no authorized-keys folder" in result.stderr, result.stderr
    (home / "authorized-keys").mkdir(parents=True)
    result = _vgpu(home, "server", "--listen", "tcp://127.0.0.1:*", "--backend", "emu")
    assert result.returncode == 1
    assert "vgpu keygen --server" in result.stderr, result.stderr


def test_authorized_keys_entries_carry_their_options_and_bad_ones_admit_nobody(tmp_path):
    keys = tmp_path / "authorized-keys"
    keys.mkdir()
    alice, bob, eve = "A" * 40, "B" * 40, "E" * 40
    (keys / "alice.key").write_text(f"{alice} mem-limit=4G sessions=4 admin\n# a comment\n")
    (keys / "bob.key").write_text(f"{bob}\n")
    (keys / "eve.key").write_text(f"{eve} mem-limit=lots\n")
    (keys / "short.key").write_text("not-a-key\n")
    (keys / "notes.txt").write_text(f"{'N' * 40}\n")
    assert read_authorized_keys(keys) == {
        alice: ("alice", {"mem-limit": 4 << 30, "sessions": 4, "admin": True}),
        bob: ("bob", {}),
    }
