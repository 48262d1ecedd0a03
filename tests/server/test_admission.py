"""Who the server admits and whose files it maps, decided from what the kernel says of a
connection, checked without becoming another user (the tests that connect as user nobody
need root; these decisions are checked wherever the tests run)."""

from __future__ import annotations

import grp
import mmap
import os

import pytest

from vgpu.sealed_files import sealed_file
from vgpu.server.client_files import SegmentRefused, map_client_file
from vgpu.server.peers import Access, Peer

NOBODY = 65534


def _verdict(access: Access, uid: int, gid: int) -> bytes:
    """The status code the ZAP handler answers for an ipc connection from uid:gid, as libzmq
    asks it (the address carries the peer's credentials: host:uid:gid:pid)."""
    request = [b"1.0", b"7", b"vgpu", f"localhost:{uid}:{gid}:4242".encode(), b"", b"NULL"]
    reply = access._verdict(request)
    assert reply[:2] == [b"1.0", b"7"]
    return reply[2]


def test_a_local_server_admits_its_own_user_and_root_only():
    access = Access()
    assert _verdict(access, os.getuid(), os.getgid()) == b"200"
    assert _verdict(access, 0, 0) == b"200"
    assert _verdict(access, NOBODY, NOBODY) == b"400"


def test_a_group_opens_a_local_server_to_its_members_only():
    group = grp.getgrgid(os.getgid()).gr_name
    access = Access(group=group)
    assert _verdict(access, NOBODY, os.getgid()) == b"200"
    assert _verdict(access, NOBODY, NOBODY) == (b"200" if os.getgid() == NOBODY else b"400")


def test_a_file_that_is_not_the_clients_own_is_not_mapped():
    """A sealed file of the right size, held by the connected process, but owned by another
    user than the one the kernel says connected."""
    fd = sealed_file("vgpu-test", mmap.PAGESIZE)
    try:
        mine = Peer("ipc", uid=os.getuid(), gid=os.getgid(), pid=os.getpid(), name="me")
        map_client_file(fd, mmap.PAGESIZE, mine, os.getpid()).close()
        other = Peer("ipc", uid=os.getuid() + 1, gid=os.getgid(), pid=os.getpid(),
                     name="other")
        with pytest.raises(SegmentRefused, match="belongs to uid"):
            map_client_file(fd, mmap.PAGESIZE, other, os.getpid())
    finally:
        os.close(fd)
