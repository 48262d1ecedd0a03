"""CurveZMQ key pairs and the files that hold them: vgpu's own keys, the servers a client
knows, and (server/peers.py reads them) the clients a server admits.

Everything lives in one folder, $VGPU_HOME (default ~/.config/vgpu), created owner-only:

    client.secret      this user's client key pair (secret; `vgpu keygen`)
    client.pub         its public key: what a server's authorized-keys folder holds
    server.secret      a server's key pair (`vgpu keygen --server`)
    server.pub         its public key: what clients put in their known-servers file
    known-servers      one server a line: `ADDRESS PUBLICKEY` (ADDRESS as `tcp://host:port`)
    authorized-keys/   one file a client, NAME.key: `PUBLICKEY [options]` (server side)

A secret file holds the secret key (Z85, 40 characters) on its first line that is not a
comment; it must be readable by its owner only, as ssh insists for its keys, because a
secret key anyone else could read is no proof of anything.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["KeyFileError", "vgpu_home", "keygen", "load_secret", "public_of", "check_public",
           "known_server_key", "KEY_CHARS"]

KEY_CHARS = 40  # a Curve25519 key in Z85
_Z85 = set("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")


class KeyFileError(ValueError):
    """A key or key file vgpu cannot use; the message says which and why."""


def vgpu_home() -> Path:
    home = os.environ.get("VGPU_HOME")
    return Path(home) if home else Path.home() / ".config" / "vgpu"


def check_public(text: str, what: str) -> str:
    """`text` if it is a public key in Z85 (40 characters of the Z85 alphabet)."""
    if len(text) != KEY_CHARS or not set(text) <= _Z85:
        raise KeyFileError(f"{what}: {text[:60]!r} is not a CurveZMQ public key (40 Z85 "
                        "characters, as `vgpu keygen` prints)")
    return text


def keygen(role: str, folder: Path | None = None, force: bool = False) -> tuple[Path, str]:
    """Make `role`'s ("client" or "server") key pair in `folder` (default vgpu_home()):
    ROLE.secret (owner-only) and ROLE.pub. Returns (secret file, public key)."""
    import zmq

    folder = folder or vgpu_home()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    secret_file, public_file = folder / f"{role}.secret", folder / f"{role}.pub"
    if secret_file.exists() and not force:
        raise KeyFileError(f"{secret_file} exists; keep it, or replace it with --force (clients "
                        "and servers that know its public key will then refuse this one)")
    public, secret = (k.decode() for k in zmq.curve_keypair())
    tmp = secret_file.with_suffix(".secret.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"# vgpu {role} secret key: never share it. Its public key: {public}\n"
                f"{secret}\n")
    os.replace(tmp, secret_file)
    public_file.write_text(f"{public}\n")
    return secret_file, public


def load_secret(path: Path) -> tuple[bytes, bytes]:
    """(public, secret) of the key pair in the secret file `path`."""
    import zmq

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise KeyFileError(f"no key at {path}: make one with `vgpu keygen`") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read the key {path}: {exc.strerror}") from None
    with os.fdopen(fd) as f:
        info = os.fstat(f.fileno())
        if info.st_mode & 0o077:
            raise KeyFileError(f"the secret key {path} is readable by others (mode "
                            f"{stat.S_IMODE(info.st_mode):o}): chmod 600 it, or make a new one")
        if info.st_uid != os.getuid():
            raise KeyFileError(f"the secret key {path} belongs to another user")
        lines = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
    secret = lines[0] if lines else ""
    try:
        check_public(secret, str(path))  # a secret key has the same form
        return zmq.curve_public(secret.encode()), secret.encode()
    except (KeyFileError, ValueError, zmq.ZMQError):
        raise KeyFileError(f"{path} holds no secret key (make one with `vgpu keygen`)") from None


def public_of(path: Path) -> str:
    return load_secret(path)[0].decode()


def known_server_key(address: str, known: Path | None = None) -> str | None:
    """The public key the known-servers file gives for `address` (`tcp://host:port`)."""
    known = known or vgpu_home() / "known-servers"
    try:
        text = known.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise KeyFileError(f"cannot read {known}: {exc.strerror}") from None
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) != 2:
            raise KeyFileError(f"{known}, line {number}: not `ADDRESS PUBLICKEY`")
        if fields[0] == address:
            return check_public(fields[1], f"{known}, line {number}")
    return None
