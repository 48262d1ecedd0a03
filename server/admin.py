"""The server's admin requests, and the moves of sessions between servers they start.

`vgpu ps`, `checkpoint`, `suspend`, `resume` and `migrate` arrive as ADMIN messages (see
vgpu.protocol). The long ones run on threads of their own (server/moves.py) and are answered
when done; meanwhile the admin client hears seq-0 notices `{"progress": [phase, done,
total]}`. `adopt` is what one server sends another to hand it a session: `begin`, `memory`
(chunks, as payload frames), `commit` (the journal and the session's own state: the session
is restored here and waits for its client), or `abort`.

A client whose session was restored here (handed over, or from `<checkpoint-dir>/<token>.vgpu`
when its own server died) says hello with its token and `resume`; the reply's `position` says
how many of its messages the restored state covers.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future

from vgpu.errors import CudaError
from vgpu.replay.image import MAGIC, ImageError, read_image
from vgpu.transport import TransportError, split_address

from . import moves
from .moves import Incoming, MoveError
from .peers import Peer
from .session import Session
from .worker import SessionEnded

__all__ = ["AdminMixin"]

log = logging.getLogger("vgpu.server")

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_DEVICE_UNAVAILABLE = 46
# How long a session handed over to this server waits for a client on another host to come
# back (it does at its next call, however long the program computes on the host meanwhile);
# one on this host waits as long as its process lives.
ADOPTED_WAIT_S = 3600.0
# Progress notices go out at most this often.
PROGRESS_INTERVAL_S = 0.1


class AdminMixin:
    """ProxyServer's admin side; the attributes it uses are ProxyServer's."""

    # ----------------------------------------------------------------- plumbing

    def _init_admin(self) -> None:
        # Work other threads hand to the I/O thread (they ring its bell).
        self._soon: collections.deque[Callable[[], None]] = collections.deque()
        self.moved: dict[bytes, str] = {}  # client identity -> where its session went
        self.incoming: dict[str, Incoming] = {}  # token -> a session being handed over
        self.adopted: dict[str, tuple[Session, int, float]] = {}  # token -> (session, slot, t)
        # Clients whose session is being restored from its image: identity -> (session, slot).
        self.restoring: dict[bytes, tuple[Session, int]] = {}

    def _close_admin(self) -> None:
        for session, _, _ in self.adopted.values():
            session.close()
        self.adopted.clear()

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the I/O thread (from any thread)."""
        self._soon.append(fn)
        self.bell.ring()

    def _run_soon(self) -> None:
        while self._soon:
            self._soon.popleft()()

    def control(self, identity: bytes, task, hold: bool = False) -> Future:
        """Run `task(session, position)` in line with the session's calls (any thread)."""
        future: Future = Future()

        def submit() -> None:
            worker = self.workers.get(identity)
            if worker is None:
                future.set_exception(SessionEnded("the session ended"))
            else:
                worker.control(task, hold, future)

        self.call_soon(submit)
        return future

    def redirect(self, identity: bytes, target: str, position: int) -> bool:
        """The session now lives at `target`: tell its client, and let it go here."""
        self._notice(identity, 0, {"redirect": target, "position": position})
        self.moved[identity] = target
        self._close_session(identity, f"moved to {target}")
        return True

    # ----------------------------------------------------------------- requests

    def _admin(self, identity: bytes, seq, body, payloads, peer: Peer) -> None:
        if body in (("ps", ()), ("ps",)):
            self._reply(identity, seq, 0, self.describe_sessions(peer))
            return
        try:
            op, (args,) = body
            handler = _ADMIN_OPS[op]
            if not isinstance(args, dict):
                raise TypeError
        except (TypeError, ValueError, KeyError):
            self._reply(identity, seq, CUDA_ERROR_INVALID_VALUE,
                        f"unknown admin request {body!r:.60}")
            return
        try:
            _authorize(peer, op, args)
            handler(self, identity, seq, args, payloads, peer)
        except (MoveError, ImageError, CudaError, OSError, TransportError) as exc:
            self._reply(identity, seq, CUDA_ERROR_INVALID_VALUE, _message(exc))

    def describe_sessions(self, peer: Peer) -> list[dict]:
        """The sessions `peer` may see: all for an admin, else its own."""
        served = [(s, self.workers[identity].queued_calls, s.status)
                  for identity, s in self.sessions.items()]
        # Handed over here, waiting for the client to reconnect at its next call.
        arriving = [(s, 0, "arriving") for s, _, _ in self.adopted.values()]
        return [{
            "session": s.id, "pid": s.pid, "host": s.host, "command": " ".join(s.argv),
            "backend": s.backend.name, "device_pid": getattr(s.backend, "pid", None),
            "memory": s.memory_in_use(), "calls": s.calls_served,
            "queued": queued, "since": s.started_at, "state": state, "token": s.token[:8],
            "checkpoint": s.last_checkpoint, "copy": self.transfers.describe(s),
            "peer": s.peer.name,
        } for s, queued, state in served + arriving if peer.admin or peer.owns(s.peer)]

    def _find(self, args: dict, peer: Peer) -> tuple[bytes, Session]:
        """The session `args` names, among those `peer` may act on (see _authorize)."""
        mine = [(i, s) for i, s in self.sessions.items() if peer.admin or peer.owns(s.peer)]
        if args.get("session") is not None:
            found = [(i, s) for i, s in mine if s.id == args["session"]]
            what = f"session {args['session']}"
        else:
            found = [(i, s) for i, s in mine if s.pid == args.get("pid")]
            what = f"pid {args.get('pid')}"
        if not found:
            raise MoveError(f"no session with {what} on this server")
        if len(found) > 1:
            raise MoveError(f"{len(found)} sessions have {what}; name one by its session id")
        return found[0]

    def _start(self, identity: bytes, seq, session: Session, name: str, work,
               done: Callable[[dict], None] = lambda result: None) -> None:
        """Run `work(progress)` on a thread for `session`; answer the admin client at
        `identity` (None: nobody asked) with its result, after `done(result)` ran."""
        if session.operation:
            raise MoveError(f"session {session.id} is busy: {session.operation} under way")
        session.operation = name
        last = [0.0]

        def progress(phase: str, so_far: int, total: int) -> None:
            now = time.monotonic()
            if identity is not None and (now - last[0] >= PROGRESS_INTERVAL_S
                                         or so_far >= total):
                last[0] = now
                self.call_soon(lambda: self._notice(
                    identity, 0, {"progress": [phase, so_far, total]}))

        def finish(code: int, result) -> None:
            session.operation = None
            if code == 0:
                done(result)
            if identity is not None:
                self._reply(identity, seq, code, result)
            elif code:
                log.warning("session %d: %s failed: %s", session.id, name, result)

        def run() -> None:
            try:
                result = work(progress)
            except (MoveError, ImageError, CudaError, OSError, SessionEnded) as exc:
                message = _message(exc)
                self.call_soon(lambda: finish(CUDA_ERROR_INVALID_VALUE, message))
            except BaseException as exc:
                log.error("session %d: %s failed:\n%s", session.id, name,
                          traceback.format_exc())
                message = f"{name} failed: {exc}"
                self.call_soon(lambda: finish(999, message))
            else:
                self.call_soon(lambda: finish(0, result))

        threading.Thread(target=run, name=f"vgpu-{name}-{session.id}", daemon=True).start()

    def _checkpoint(self, identity: bytes, seq, args: dict, payloads, peer: Peer) -> None:
        client, session = self._find(args, peer)
        path = args.get("path") or self._standby_path(session)
        if path is None:
            raise MoveError("name the image's path (-o PATH): this server keeps no "
                            "checkpoint folder (vgpu server --checkpoint-dir)")
        self._start_checkpoint(identity, seq, client, session, _image_path(path))

    def _start_checkpoint(self, identity, seq, client: bytes, session: Session,
                          path: str) -> None:
        if session.status != "running":
            raise MoveError(f"session {session.id} is {session.status}")
        session.check_movable()

        def done(result: dict) -> None:
            session.last_checkpoint = {"path": result["path"], "at": time.time(),
                                       "bytes": result["bytes"], "written": result["written"],
                                       "position": result["position"]}
            if client in self.sessions and path == self._standby_path(session):
                # A standby can take over from here: the client may forget what it kept.
                self._notice(client, 0, {"checkpointed": result["position"]})

        self._start(identity, seq, session, "checkpoint",
                    lambda progress: moves.checkpoint(self, client, path, progress), done)

    def _suspend(self, identity: bytes, seq, args: dict, payloads, peer: Peer) -> None:
        client, session = self._find(args, peer)
        if session.status != "running":
            raise MoveError(f"session {session.id} is {session.status}")
        session.check_movable()
        path = moves.temporary_image_path(self.checkpoint_dir, session.token)
        session.status = "suspending"

        def done(result: dict) -> None:
            session.status = "suspended"
            session.suspended_image = result["path"]

        def work(progress):
            try:
                return moves.suspend(self, client, path, progress)
            except BaseException:
                self.call_soon(lambda: setattr(session, "status", "running"))
                raise

        self._start(identity, seq, session, "suspend", work, done)

    def _resume(self, identity: bytes, seq, args: dict, payloads, peer: Peer) -> None:
        client, session = self._find(args, peer)
        if session.status != "suspended":
            raise MoveError(f"session {session.id} is not suspended ({session.status})")
        path = session.suspended_image
        target = args.get("to")
        if not target or split_address(target)[0] == self.endpoint:
            def done(result: dict) -> None:
                session.status = "running"
                session.suspended_image = None

            self._start(identity, seq, session, "resume",
                        lambda progress: moves.resume_here(self, client, path, progress), done)
            return
        self._start(identity, seq, session, "resume",
                    lambda progress: moves.move(self, client, session.token, target, False,
                                               progress, path))

    def _migrate(self, identity: bytes, seq, args: dict, payloads, peer: Peer) -> None:
        client, session = self._find(args, peer)
        target = args.get("to")
        if not isinstance(target, str) or not target:
            raise MoveError("migrate needs the address of the server to move to")
        if split_address(target)[0] == self.endpoint:
            raise MoveError("the session is already on this server")
        if session.status != "running":
            raise MoveError(f"session {session.id} is {session.status}")
        session.check_movable()
        session.status = "migrating"

        def work(progress):
            try:
                return moves.move(self, client, session.token, target,
                                  bool(args.get("precopy", True)),
                                  progress)
            except BaseException:
                self.call_soon(lambda: setattr(session, "status", "running"))
                raise

        self._start(identity, seq, session, "migrate", work)

    # ----------------------------------------------------------------- sessions arriving

    def _adopt(self, identity: bytes, seq, args: dict, payloads, peer: Peer) -> None:
        token, phase = args.get("token"), args.get("phase")
        if not isinstance(token, str) or len(token) != 32:
            raise MoveError("adopt: a session token is needed")
        if phase == "begin":
            self.incoming[token] = Incoming(token, self.device_memory)
            self._reply(identity, seq, 0, {})
        elif phase == "abort":
            self.incoming.pop(token, None)
            self._reply(identity, seq, 0, {})
        elif phase == "memory":
            self._incoming(token).take_chunks(args.get("chunks") or [], payloads)
            self._reply(identity, seq, 0, {})
        elif phase == "commit":
            incoming = self.incoming.pop(token, None)
            if incoming is None:
                raise MoveError(f"adopt: no session {token[:8]} is being handed over")
            state, regions = args["state"], [tuple(r) for r in args["regions"]]
            backings, fill = incoming.fill(regions)
            session, slot = self._restored_session(token, state, regions, fill, peer,
                                                   backings)
            old = self.adopted.pop(token, None)
            if old is not None:
                old[0].close()
            self.adopted[token] = (session, slot, time.monotonic())
            log.info("session %d restored from another server; waiting for its client",
                     session.id)
            self._reply(identity, seq, 0, {"session": session.id})
        else:
            raise MoveError(f"adopt: unknown phase {phase!r:.20}")

    def _incoming(self, token: str) -> Incoming:
        incoming = self.incoming.get(token)
        if incoming is None:
            raise MoveError(f"adopt: no session {token[:8]} is being handed over")
        return incoming

    def _restored_session(self, token: str, state: dict, regions, fill, peer: Peer,
                          backings=None, hello: dict | None = None) -> tuple[Session, int]:
        if state.get("token") != token:
            raise MoveError("the image belongs to another session")
        client = state["client"]
        hello = hello or {"token": token, "pid": client["pid"], "host": client["host"],
                          "argv": client["argv"], "memcheck": state["memcheck"]}
        session, slot = self._new_session(hello, state["arena"][0], peer)
        try:
            with session.backend.running():
                session.restore(state, regions, fill, backings)
        except BaseException:
            session.close()
            raise
        session.position = int(state["position"])
        return session, slot

    def _resumed_session(self, identity: bytes, seq, hello: dict, peer: Peer
                         ) -> tuple[Session, int] | None:
        """The session a reconnecting client comes back to: handed over to this server, or
        else a fresh one (position 0: the client replays what it kept, if it kept
        everything); or None when it is being restored from its image in the checkpoint
        folder, on a thread of its own, which answers the hello when done."""
        token = hello.get("token")
        adopted = self.adopted.pop(token, None) if isinstance(token, str) else None
        if adopted is not None:
            session, slot, _ = adopted
            session.attach_client(hello, peer)
            return session, slot
        path = self._standby_path_of(token)
        if path is None or not os.path.exists(path):
            return self._new_session(hello, None, peer)
        try:
            image = read_image(path)
            if image.state.get("token") != token:
                raise MoveError("the image belongs to another session")
            session, slot = self._new_session(hello, image.state["arena"][0], peer)
        except (ImageError, MoveError, CudaError, KeyError, TypeError, ValueError) as exc:
            raise _unrestorable(token, path, exc) from None
        self.restoring[identity] = (session, slot)

        def restore() -> None:
            try:
                with session.backend.running():
                    session.restore(image.state, image.regions, image.read_region)
                session.position = int(image.state["position"])
            except Exception as exc:  # what the image holds may not fit: refuse, clearly
                error = _unrestorable(token, path, exc)
                self.call_soon(lambda: self._restored(identity, seq, session, slot, error))
            else:
                self.call_soon(lambda: self._restored(identity, seq, session, slot, None))

        threading.Thread(target=restore, name=f"vgpu-restore-{session.id}", daemon=True).start()
        return None

    def _restored(self, identity: bytes, seq, session: Session, slot: int,
                  error: CudaError | None) -> None:
        if self.restoring.get(identity, (None,))[0] is not session:  # the client went away
            session.close()
            return
        del self.restoring[identity]
        if error is not None:
            session.close()
            self._reply(identity, seq, error.code, error.message)
        else:
            log.info("session %d restored from its image", session.id)
            self._open(identity, seq, session, slot)

    def _forget_restoring(self, identity: bytes) -> None:
        """A client that says hello again gives up the restore it was waiting for."""
        self.restoring.pop(identity, None)

    def _standby_path(self, session: Session) -> str | None:
        return self._standby_path_of(session.token)

    def _standby_path_of(self, token) -> str | None:
        if not self.checkpoint_dir or not isinstance(token, str) or len(token) != 32 or \
                not all(c in "0123456789abcdef" for c in token):
            return None
        return os.path.join(self.checkpoint_dir, f"{token}.vgpu")

    # ----------------------------------------------------------------- policy

    def _checkpoint_due_sessions(self) -> None:
        """`--checkpoint-every`: checkpoint each running session whose last checkpoint is
        that old, if it did anything since; and drop handed-over sessions never claimed."""
        now = time.monotonic()
        for token, (session, _, since) in list(self.adopted.items()):
            local = session.host == self.host and session.pid
            if not self._client_alive(session) or (not local and now - since > ADOPTED_WAIT_S):
                log.warning("session %d was handed over but its client never came",
                            session.id)
                self.adopted.pop(token)[0].close()
        if not self.checkpoint_every:
            return
        for client, session in list(self.sessions.items()):
            last = session.last_checkpoint
            due = (time.time() - (last["at"] if last else session.started_at)
                   >= self.checkpoint_every)
            changed = last is None or last["position"] != session.position
            if due and changed and session.status == "running" and not session.operation \
                    and not session.segments:
                self._start_checkpoint(None, 0, client, session, self._standby_path(session))


def _authorize(peer: Peer, op: str, args: dict) -> None:
    """Refuse what only an admin may ask (see Peer.admin): to hand a session over or take
    one, to send one to another server (the server connects where it is told), or to write
    an image where the request says (the server writes as its own user). A session's owner
    may checkpoint it into the server's checkpoint folder, suspend and resume it here."""
    if peer.admin:
        return
    if op in ("adopt", "migrate") or (op == "resume" and args.get("to")) or \
            (op == "checkpoint" and args.get("path")):
        what = {"adopt": "hand sessions to this server", "migrate": "move sessions",
                "resume": "resume a session on another server",
                "checkpoint": "write an image where it names"}[op]
        raise MoveError(f"{peer.name} may not {what}: only the server's own user, root, or "
                        f"a key whose authorized-keys entry says `admin`")


def _image_path(path) -> str:
    """Where an admin client asks for an image: an absolute path, and never over a file
    that is not already a vgpu image."""
    if not isinstance(path, str) or not os.path.isabs(path):
        raise MoveError(f"the image path must be absolute, not {path!r:.80}")
    if os.path.exists(path) and not _is_image(path):
        raise MoveError(f"{path} exists and is not a vgpu checkpoint image; "
                        f"not overwriting it")
    return path


def _unrestorable(token: str, path: str, exc: Exception) -> CudaError:
    log.error("cannot restore session %s from %s: %s", token[:8], path, exc)
    why = _message(exc)
    return CudaError(CUDA_ERROR_DEVICE_UNAVAILABLE, f"the session cannot be restored: "
                                                    f"{why if path in why else f'{path}: {why}'}")


def _is_image(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _message(exc: BaseException) -> str:
    if isinstance(exc, CudaError):
        return exc.message
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


_ADMIN_OPS = {
    "checkpoint": AdminMixin._checkpoint,
    "suspend": AdminMixin._suspend,
    "resume": AdminMixin._resume,
    "migrate": AdminMixin._migrate,
    "adopt": AdminMixin._adopt,
}
