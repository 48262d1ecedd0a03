"""The command line of vgpu's transport security: `vgpu keygen`, and the options of `vgpu
server` and `vgpu run` that say who may connect and how (see vgpu/keys.py for the files)."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["add_keygen_parser", "keygen_command", "add_server_options", "server_access",
           "add_run_options", "server_address_with_key"]


def add_keygen_parser(sub) -> None:
    p = sub.add_parser("keygen", help="make a CurveZMQ key pair for tcp connections",
                       description="Make this user's client key pair (or, with --server, a "
                                   "server's) in $VGPU_HOME (default ~/.config/vgpu).")
    p.add_argument("--server", action="store_true", help="a server's key pair")
    p.add_argument("--dir", default=None, metavar="DIR", help="where (default $VGPU_HOME)")
    p.add_argument("--force", action="store_true", help="replace an existing key pair")


def keygen_command(args) -> int:
    from vgpu.keys import KeyFileError, keygen, vgpu_home

    role = "server" if args.server else "client"
    folder = Path(args.dir) if args.dir else vgpu_home()
    try:
        secret_file, public = keygen(role, folder, args.force)
    except (KeyFileError, OSError) as exc:
        print(f"vgpu keygen: {exc}", file=sys.stderr)
        return 1
    print(f"{role} key pair in {secret_file} (keep it secret); its public key:\n{public}")
    if role == "client":
        print(f"A server admits it once {folder / 'client.pub'} is copied into its "
              "authorized-keys folder as NAME.key.")
    else:
        print("Clients connect with tcp://HOST:PORT#serverkey=<that key>, or list "
              "`tcp://HOST:PORT <that key>` in their known-servers file.")
    return 0


def add_server_options(p) -> None:
    p.add_argument("--key", default=None, metavar="FILE",
                   help="the server's key pair for tcp (default $VGPU_HOME/server.secret, "
                        "made by `vgpu keygen --server`)")
    p.add_argument("--authorized-keys", default=None, metavar="DIR",
                   help="the clients a tcp server admits: one NAME.key file each, holding "
                        "the client's public key [and options] (default "
                        "$VGPU_HOME/authorized-keys)")
    p.add_argument("--insecure", action="store_true",
                   help="tcp without encryption or authentication: anyone who reaches the "
                        "port can use the device")
    p.add_argument("--group", default=None, metavar="GROUP",
                   help="admit the local users of GROUP too (the socket and its folder become "
                        "the group's)")


def server_access(args, address: str):
    """The Access that `vgpu server`'s options ask for; warns about --insecure."""
    from vgpu.keys import vgpu_home
    from vgpu.server.peers import Access

    if args.insecure:
        if address.startswith("tcp://"):
            print("vgpu server: warning: --insecure: tcp without encryption or "
                  "authentication; anyone who reaches the port can use the device and "
                  "read what clients send", file=sys.stderr)
        else:
            print("vgpu server: warning: --insecure has no effect on an ipc socket",
                  file=sys.stderr)
    home = vgpu_home()
    return Access(insecure=args.insecure,
                  secret_file=Path(args.key) if args.key else home / "server.secret",
                  authorized_keys=Path(args.authorized_keys) if args.authorized_keys
                  else home / "authorized-keys",
                  group=args.group)


def add_run_options(p) -> None:
    p.add_argument("--insecure", action="store_true",
                   help="connect to a tcp server without encryption (VGPU_INSECURE=1)")


def server_address_with_key(endpoint: str, public_key: str | None) -> str:
    """The address clients use: a tcp server's carries its key (`#serverkey=`)."""
    return f"{endpoint}#serverkey={public_key}" if public_key else endpoint
