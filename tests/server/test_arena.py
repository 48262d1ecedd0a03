"""VaArena: where allocations and reservations of the virtual memory API are placed."""

from __future__ import annotations

from vgpu.server.arena import VaArena

BASE = 1 << 44
MIB = 1 << 20


def test_reservations_are_aligned_and_take_a_free_fixed_address():
    arena = VaArena(BASE, 1 << 40)
    first = arena.alloc(100)
    reserved = arena.reserve(4 * MIB, 2 * MIB)
    assert reserved % (2 * MIB) == 0 and reserved >= first + 512
    wanted = reserved + 64 * MIB
    assert arena.reserve(2 * MIB, 2 * MIB, wanted) == wanted
    elsewhere = arena.reserve(2 * MIB, 2 * MIB, reserved)  # taken: placed elsewhere
    assert elsewhere not in (reserved, wanted)
    assert not reserved <= elsewhere < reserved + 4 * MIB
    assert arena.reserve(2 * MIB, 2 * MIB, BASE + 2 * MIB + 4096) % (2 * MIB) == 0  # unaligned


def test_allocations_never_land_in_a_reservation_which_holds_no_memory():
    arena = VaArena(BASE, 1 << 40)
    reserved = arena.reserve(64 * MIB, 2 * MIB, BASE)
    assert reserved == BASE and arena.bytes_in_use == 0
    address = arena.alloc(MIB)
    assert address >= BASE + 64 * MIB
    assert arena.find(BASE + 4096) is None and arena.find_reservation(BASE + 4096) == (
        BASE, 64 * MIB)
    assert arena.allocations() == [(address, MIB)]
    assert arena.reservations() == [(BASE, 64 * MIB)]
    arena.hold(2 * MIB)
    assert arena.bytes_in_use == 3 * MIB
    arena.unreserve(BASE)
    assert arena.alloc(MIB) == BASE and arena.reservations() == []


def test_a_reservation_that_does_not_fit_gets_none():
    arena = VaArena(BASE, 8 * MIB)
    assert arena.reserve(8 * MIB, 2 * MIB) == BASE
    assert arena.reserve(2 * MIB, 2 * MIB) is None


def test_a_fixed_address_beyond_the_arena_is_had_only_inside_its_fixed_window():
    arena = VaArena(BASE, 1 << 40, fixed_window=(BASE, 4 << 40))
    far = BASE + (2 << 40)
    assert arena.reserve(2 * MIB, 2 * MIB, far) != far  # only the arena's own range
    assert arena.reserve(2 * MIB, 2 * MIB, far + 4 * MIB, anywhere=True) == far + 4 * MIB
    beyond = BASE + (4 << 40)
    assert BASE <= arena.reserve(2 * MIB, 2 * MIB, beyond, anywhere=True) < BASE + (1 << 40)
    assert arena.alloc(MIB) < BASE + (1 << 40)  # allocations stay in the arena
    arena.unreserve(far + 4 * MIB)


def test_each_device_places_its_allocations_in_its_own_region():
    """A session with two devices: each device's allocations first-fit in its half of the
    arena, so no granule holds both devices' memory; a reservation and a fixed address (a
    restore's) may lie anywhere, and a full region has no room, however free the other is."""
    arena = VaArena(BASE, 1 << 40)
    arena.split(2)
    half = BASE + (1 << 39)
    assert arena.alloc(100, region=0) == BASE
    across = arena.reserve(4 * MIB, 2 * MIB, half - 2 * MIB)  # across the boundary
    assert across == half - 2 * MIB
    assert arena.alloc(100, region=1) == half + 2 * MIB  # after what reaches into it
    assert arena.alloc(100, region=0) == BASE + 512
    assert arena.alloc(100, half + 8 * MIB) == half + 8 * MIB
    assert arena.alloc(100, region=1) == half + 2 * MIB + 512
    assert arena.alloc(1 << 39, region=1) is None
    assert arena.alloc(1 << 38, region=0) is not None
