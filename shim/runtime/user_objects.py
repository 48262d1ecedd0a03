"""CUDA user objects (runtime API): the driver layer's (shim/driver/graph_user_objects.py),
whose flags and errors have the same numbers."""

from __future__ import annotations

from ..driver import graph_user_objects
from ._state import api

__all__ = ["cudaUserObjectCreate", "cudaUserObjectRetain", "cudaUserObjectRelease",
           "cudaGraphRetainUserObject", "cudaGraphReleaseUserObject"]

_driver = graph_user_objects


@api
def cudaUserObjectCreate(object_out, data, destroy, initial, flags):
    _driver.cuUserObjectCreate.__wrapped__(object_out, data, destroy, initial, flags)


@api
def cudaUserObjectRetain(user_object, count):
    _driver.cuUserObjectRetain.__wrapped__(user_object, count)


@api
def cudaUserObjectRelease(user_object, count):
    _driver.cuUserObjectRelease.__wrapped__(user_object, count)


@api
def cudaGraphRetainUserObject(graph, user_object, count, flags):
    _driver.cuGraphRetainUserObject.__wrapped__(graph, user_object, count, flags)


@api
def cudaGraphReleaseUserObject(graph, user_object, count):
    _driver.cuGraphReleaseUserObject.__wrapped__(graph, user_object, count)
