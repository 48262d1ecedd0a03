"""Executable graphs as the server keeps them, driven through the wire protocol: a graph
is sent once and launched by handle, it moves with its session, and what a client may put in
one is checked (the shims' own use is tested by the graph programs of tests/e2e and
tests/runtime)."""

from __future__ import annotations

import os
import struct

from test_session_state_protocol import CONTEXT, RawClient, admin, make_session, two_servers

__all__ = ["two_servers"]  # the fixture, shared with the state-protocol tests

MODULE, FUNCTION, GRAPH = 21, 22, 23
THREADS = 64
SLOTS = THREADS + 1  # one u32 past what a launch touches, for a launch moved along by one
# values[i] += 1 for each of THREADS u32 values
ADD_ONE_PTX = b"""
.version 9.0
.target sm_75
.address_size 64
.visible .entry add_one(.param .u64 values)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [values];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    ld.global.u32 %r2, [%rd3];
    add.s32 %r3, %r2, 1;
    st.global.u32 [%rd3], %r3;
    ret;
}
"""


def _add_one(values: int, function: int = FUNCTION) -> list:
    return ["cuLaunchKernel", [function, 1, 1, 1, THREADS, 1, 1, 0, 0,
                               values.to_bytes(8, "little")]]


def _with_kernel(client: RawClient) -> int:
    """The session holds the add_one kernel and SLOTS zeroed u32 values: their address."""
    code, result, *_ = client.call(
        ["cuModuleLoadData", [MODULE, CONTEXT, ["inline", ADD_ONE_PTX], len(ADD_ONE_PTX)]],
        ["cuModuleGetFunction", [FUNCTION, MODULE, "add_one"]])
    assert code == 0, result
    code, values, *_ = client.call(["cuMemAlloc", [CONTEXT, SLOTS * 4]])
    assert code == 0, values
    code, result, *_ = client.call(["vgpuMemset", [values, bytes(4), SLOTS]])
    assert code == 0, result
    return values


def _values(client: RawClient, address: int) -> list[int]:
    return list(struct.unpack(f"<{SLOTS}I", client.read(address, SLOTS * 4)))


def test_a_graph_is_kept_launched_by_handle_and_moves_with_its_session(two_servers):
    a, b, _ = two_servers
    client = RawClient(a.address)
    make_session(client, sizes=(4096,))
    values = _with_kernel(client)
    code, result, *_ = client.call(
        ["vgpuGraphCreate", [GRAPH, CONTEXT, [[_add_one(values), _add_one(values)]]]])
    assert code == 0, result
    code, result, *_ = client.call(["vgpuGraphLaunch", [GRAPH, 0, 0]], ["vgpuSynchronize", []])
    assert code == 0, result
    assert _values(client, values) == [2] * THREADS + [0]

    code, moved = admin(a.address, "migrate", pid=os.getpid(), to=b.address)
    assert code == 0, moved
    there = RawClient(b.address, client.token, resume=moved["position"])
    code, result, *_ = there.call(["vgpuGraphLaunch", [GRAPH, 0, 9]], ["vgpuSynchronize", []])
    assert code == 0, result
    assert _values(there, values) == [4] * THREADS + [0]  # it came along; ran on stream 9

    # A node's new parameters replace its call, and move too.
    code, result, *_ = there.call(["vgpuGraphSetCall", [GRAPH, 0, 1, _add_one(values + 4)]],
                                  ["vgpuGraphLaunch", [GRAPH, 0, 0]], ["vgpuSynchronize", []])
    assert code == 0, result
    assert _values(there, values) == [5] + [6] * (THREADS - 1) + [1]
    code, result, *_ = there.call(["vgpuGraphDestroy", [GRAPH]],
                                  ["vgpuGraphLaunch", [GRAPH, 0, 0]])
    assert code == 400, result


def test_what_a_graph_may_hold_is_checked(server):
    client = RawClient(server.address)
    make_session(client, sizes=(4096,))
    values = _with_kernel(client)
    refused = {
        "an allocation": [["cuMemAlloc", [CONTEXT, 64]]],
        "a copy from message frames": [["cuMemcpyHtoD", [values, ["frame", 0], 4]]],
        "a copy straight from client memory": [["cuMemcpyDtoH", [values, 4, ["peer", 4096]]]],
        "a malformed call": [["cuLaunchKernel"]],
    }
    for what, segment in refused.items():
        code, result, *_ = client.call(["vgpuGraphCreate", [GRAPH, CONTEXT, [segment]]])
        assert code == 1, what
    too_many = [_add_one(values)] * ((1 << 16) + 1)
    code, result, *_ = client.call(["vgpuGraphCreate", [GRAPH, CONTEXT, [too_many]]])
    assert code == 2 and "calls at most" in result

    # Handles in a graph are checked when it runs: a failing call ends the launch.
    code, result, *_ = client.call(["vgpuGraphCreate", [GRAPH, CONTEXT, [
        [_add_one(values), _add_one(values, function=999), _add_one(values)]]]])
    assert code == 0, result
    code, result, *_ = client.call(["vgpuGraphLaunch", [GRAPH, 0, 0]])
    assert code == 400 and "function" in result
    assert _values(client, values) == [1] * THREADS + [0]
    for call, expected in ((["vgpuGraphLaunch", [GRAPH, 1, 0]], 1),
                           (["vgpuGraphLaunch", [GRAPH, 0, 12345]], 400),
                           (["vgpuGraphSetCall", [GRAPH, 0, 0, ["vgpuMemset",
                                                                [values, bytes(4), 1]]]], 1),
                           (["vgpuGraphSetCall", [GRAPH, 0, 3, _add_one(values)]], 1),
                           (["vgpuGraphCreate", [GRAPH, CONTEXT, []]], 400)):
        code, result, *_ = client.call(call)
        assert code == expected, (call[0], result)


def _conditional(cell: int, kind: int, bodies: list[int]) -> list:
    return ["vgpuGraphConditional", [cell, kind, bodies]]


def _set(cell: int, value: int) -> list:
    return ["vgpuMemset", [cell, struct.pack("<I", value), 1]]


def test_conditional_nodes_run_the_bodies_their_condition_selects(two_servers):
    """A conditional node reads its condition from device memory where it runs; its bodies
    are later segments of the graph, which nothing else refers to; it moves with its
    session."""
    a, b, _ = two_servers
    client = RawClient(a.address)
    make_session(client, sizes=(4096,))
    values = _with_kernel(client)
    code, cell, *_ = client.call(["cuMemAlloc", [CONTEXT, 4]])
    assert code == 0, cell
    if_, while_, switch = 0, 1, 2
    segments = [
        [_set(cell, 2), _conditional(cell, switch, [1, 2, 3]),   # case 2: five adds
         _conditional(cell, if_, [2, 1]),                        # still 2: then, two adds
         _set(cell, 0), _conditional(cell, if_, [1, 2]),         # 0: else, two adds
         _set(cell, 1), _conditional(cell, while_, [4])],        # once: the body clears it
        [_add_one(values)],
        [_add_one(values), _add_one(values)],
        [_add_one(values)] * 5,
        [_add_one(values), _set(cell, 0)],
    ]
    code, result, *_ = client.call(["vgpuGraphCreate", [GRAPH, CONTEXT, segments]],
                                   ["vgpuGraphLaunch", [GRAPH, 0, 0]], ["vgpuSynchronize", []])
    assert code == 0, result
    assert _values(client, values) == [5 + 2 + 2 + 1] * THREADS + [0]
    code, moved = admin(a.address, "migrate", pid=os.getpid(), to=b.address)
    assert code == 0, moved
    client = RawClient(b.address, client.token, resume=moved["position"])
    code, result, *_ = client.call(["vgpuGraphLaunch", [GRAPH, 0, 0]], ["vgpuSynchronize", []])
    assert code == 0, result
    assert _values(client, values) == [2 * 10] * THREADS + [0]

    refused = {
        "a body that is its own segment": [[_conditional(cell, if_, [0])]],
        "a body before its node": [[], [_conditional(cell, if_, [0])]],
        "a body past the graph": [[_conditional(cell, if_, [1])]],
        "no bodies": [[_conditional(cell, if_, [])], []],
        "an unknown type": [[_conditional(cell, 3, [1])], []],
        "a malformed node": [[["vgpuGraphConditional", [cell, if_]]], []],
    }
    for what, graph in refused.items():
        code, result, *_ = client.call(["vgpuGraphCreate", [GRAPH + 1, CONTEXT, graph]])
        assert code == 1, what
    # The condition's address is checked as any copy's is, where the node runs.
    code, result, *_ = client.call(
        ["vgpuGraphCreate", [GRAPH + 1, CONTEXT, [[_conditional(1 << 20, if_, [1])], []]]],
        ["vgpuGraphLaunch", [GRAPH + 1, 0, 0]])
    assert code == 1, result


# tail_launch(graph, code): *code = cudaGraphLaunch(graph, cudaStreamGraphTailLaunch), as
# nvcc calls it
TAIL_LAUNCH_PTX = b"""
.version 9.0
.target sm_75
.address_size 64
.extern .func (.param .b32 func_retval0) cudaGraphLaunch(.param .b64 p0, .param .b64 p1);
.visible .entry tail_launch(.param .u64 graph, .param .u64 code)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [graph];
    ld.param.u64 %rd3, [code];
    mov.u64 %rd2, 72057594037927936;
    {
    .param .b64 p0;
    st.param.b64 [p0], %rd1;
    .param .b64 p1;
    st.param.b64 [p1], %rd2;
    .param .b32 rv;
    call.uni (rv), cudaGraphLaunch, (p0, p1);
    ld.param.b32 %r1, [rv];
    }
    st.global.u32 [%rd3], %r1;
    ret;
}
"""


def _tail_launch(launcher: int, graph: int, code_at: int) -> list:
    return ["cuLaunchKernel", [launcher, 1, 1, 1, 1, 1, 1, 0, 0,
                               graph.to_bytes(8, "little") + code_at.to_bytes(8, "little")]]


def test_tail_launches_wait_for_the_graphs_last_segment(server, tmp_path):
    """A kernel of a graph launched from the host tail-launches a device graph: it runs
    after the graph's last segment (a host node of the client's may come between), and a
    checkpoint between the segments, which could not carry it, is refused. A device graph
    naming memory the session does not hold is refused where a kernel launches it."""
    client = RawClient(server.address)
    make_session(client, sizes=(4096,))
    values = _with_kernel(client)
    launcher, device_graph, stray_graph = FUNCTION + 10, GRAPH + 1, GRAPH + 2
    code_at = values + 4 * THREADS  # the slot past the values
    code, result, *_ = client.call(
        ["cuModuleLoadData", [MODULE + 10, CONTEXT, ["inline", TAIL_LAUNCH_PTX],
                              len(TAIL_LAUNCH_PTX)]],
        ["cuModuleGetFunction", [launcher, MODULE + 10, "tail_launch"]],
        # a memset, a kernel and a copy, as a device graph may hold
        ["vgpuGraphCreate", [device_graph, CONTEXT, [[
            ["vgpuMemset", [values, struct.pack("<I", 5), 1]], _add_one(values),
            ["cuMemcpyDtoD", [values + 4, values, 4]]]], True]],
        ["vgpuGraphCreate", [stray_graph, CONTEXT, [[
            ["cuMemcpyDtoD", [values, 0x10, 4]]]], True]],
        ["vgpuGraphUpload", [device_graph, 0]], ["vgpuGraphUpload", [stray_graph, 0]],
        ["vgpuGraphCreate", [GRAPH, CONTEXT, [
            [_tail_launch(launcher, device_graph, code_at)], [_add_one(values)]]]])
    assert code == 0, result
    code, result, *_ = client.call(["vgpuGraphLaunch", [GRAPH, 0, 0]], ["vgpuSynchronize", []])
    assert code == 0, result
    assert _values(client, values) == [0] * SLOTS  # the tail waits for the second segment
    image = str(tmp_path / "session.vgpu")
    code, refused = admin(server.address, "checkpoint", pid=os.getpid(), path=image)
    assert code == 1 and "tail-launched" in refused, refused
    code, result, *_ = client.call(["vgpuGraphLaunch", [GRAPH, 1, 0]], ["vgpuSynchronize", []])
    assert code == 0, result
    assert _values(client, values) == [6, 6] + [2] * (THREADS - 2) + [0]
    code, written = admin(server.address, "checkpoint", pid=os.getpid(), path=image)
    assert code == 0, written
    code, result, *_ = client.call(["cuLaunchKernel", _tail_launch(launcher, stray_graph,
                                                                   code_at)[1]],
                                   ["vgpuSynchronize", []])
    assert code == 0, result
    assert _values(client, values)[:2] == [6, 6]  # nothing ran
    assert _values(client, values)[THREADS] == 1  # cudaErrorInvalidValue
