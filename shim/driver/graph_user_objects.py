"""CUDA user objects (driver API): a destructor with a reference count, whose references the
program and graphs own, so a resource that graph launches use lives as long as they may.

Everything here lives in the client: the server never sees a user object, so nothing of
them needs journaling (a session holding graphs with user objects checkpoints and moves as
one without). A graph owns references (cuGraphRetainUserObject); a copy of a graph (a
clone, a child graph node's graph, an executable graph's own copy) owns the same ones
again, and gives them back when it goes (graph_model.py). When the last reference goes, the
destructor runs: at once if no executable graph holding the object was launched, else on
vgpu's host-function thread once the work queued before it on every stream such a graph
was launched on is done (vgpu/host_functions.py), so it never runs while a launch that may
use the resource is still running.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ._state import CudaError, E, api, check_out, ffi, handle_of, state
from .graph_model import Graph, graphs

CU_USER_OBJECT_NO_DESTRUCTOR_SYNC = 1
CU_GRAPH_USER_OBJECT_MOVE = 1
USER_OBJECT = 0x43  # handle kind, after graph_model's
_INT_MAX = 0x7FFF_FFFF
_BUILTIN_STREAMS = (0, 1, 2)  # NULL, legacy, per-thread


@dataclass(eq=False)
class UserObject:
    handle: int
    destroy: object  # the CUhostFn
    data: object  # its argument
    references: int  # all of them: the program's and its graphs'
    held_by_graphs: int = 0
    # Streams that executable graphs holding the object were launched on
    launched_on: set[int] = field(default_factory=set)

    def retain(self, count: int) -> None:
        self.references += count

    def release(self, count: int) -> None:
        self.references -= count
        if self.references == 0:
            objects.pop(self.handle, None)
            _destroy_after_launches(self)

    def held(self, count: int, move: bool = False) -> None:
        """A graph took `count` references: new ones, or (`move`) the program's."""
        self.held_by_graphs += count
        if not move:
            self.retain(count)

    def given_back(self, count: int) -> None:
        """A graph let go of `count` references."""
        self.held_by_graphs -= count
        self.release(count)


objects: dict[int, UserObject] = {}


def _destroy_after_launches(obj: UserObject) -> None:
    conn = state.connection
    streams = [s for s in obj.launched_on if s in _BUILTIN_STREAMS or s in state.streams]
    if not streams or conn is None:
        obj.destroy(obj.data)
        return
    left = [len(streams)]
    lock = threading.Lock()

    def arrive() -> None:  # on the host-function thread, once a stream's work before is done
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            obj.destroy(obj.data)

    for stream in streams:
        conn.host_functions.queue(stream, arrive)


def held_by(graph: Graph) -> set[UserObject]:
    """The user objects a graph, the graphs its nodes own among them, hold references to."""
    held = set(graph.user_objects)
    for node in graph.nodes:
        for owned in ([node.child] if node.child is not None else []) + node.bodies:
            held |= held_by(owned)
    return held


def _object(value) -> UserObject:
    return objects[handle_of(value, USER_OBJECT, objects, E.CUDA_ERROR_INVALID_VALUE)]


def _count(count: int) -> int:
    if not 0 < count <= _INT_MAX:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "count must be from 1 to INT_MAX")
    return count


def _program_owned(obj: UserObject, count: int) -> None:
    if count > obj.references - obj.held_by_graphs:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"the program owns {obj.references - obj.held_by_graphs} references "
                        f"to the user object, not {count}")


@api
def cuUserObjectCreate(object_out, data, destroy, initial, flags):
    check_out(object_out)
    if destroy == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the destructor is NULL")
    if flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "flags must be CU_USER_OBJECT_NO_DESTRUCTOR_SYNC")
    obj = UserObject(state.new_handle(USER_OBJECT), destroy, data, _count(initial))
    objects[obj.handle] = obj
    object_out[0] = ffi.cast("void *", obj.handle)


@api
def cuUserObjectRetain(user_object, count):
    _object(user_object).retain(_count(count))


@api
def cuUserObjectRelease(user_object, count):
    obj = _object(user_object)
    _program_owned(obj, _count(count))
    obj.release(count)


@api
def cuGraphRetainUserObject(graph, user_object, count, flags):
    target = graphs.graph(graph)
    obj = _object(user_object)
    _count(count)
    if flags & ~CU_GRAPH_USER_OBJECT_MOVE:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown flags 0x{flags:x}")
    move = bool(flags & CU_GRAPH_USER_OBJECT_MOVE)
    if move:
        _program_owned(obj, count)
    target.user_objects[obj] = target.user_objects.get(obj, 0) + count
    obj.held(count, move)


@api
def cuGraphReleaseUserObject(graph, user_object, count):
    target = graphs.graph(graph)
    obj = _object(user_object)
    if _count(count) > target.user_objects.get(obj, 0):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"the graph owns {target.user_objects.get(obj, 0)} references to "
                        f"the user object, not {count}")
    held = target.user_objects.pop(obj) - count
    if held:
        target.user_objects[obj] = held
    obj.given_back(count)
