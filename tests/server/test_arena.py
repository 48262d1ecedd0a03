"""VaArena: where allocations and reservations of the virtual memory API are placed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

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


def _first_free(taken: dict[int, int], size: int, alignment: int, base: int, limit: int):
    """First fit as its definition says: the lowest address aligned to `alignment` whose
    `size` bytes (rounded to the arena's 512) touch no taken range."""
    span = -(-max(size, 1) // 512) * 512
    cursor = base
    for start in sorted(taken):
        cursor = -(-cursor // alignment) * alignment
        if start >= cursor + span:
            break
        cursor = max(cursor, start + taken[start])
    cursor = -(-cursor // alignment) * alignment
    return cursor if cursor + span <= limit else None


# A random life of an arena: allocate (size, alignment), free the n-th live allocation,
# reserve at a fixed address or anywhere, unreserve.
_STEPS = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.integers(0, 5 * MIB), st.sampled_from([512, 4096, 2 * MIB]),
              st.integers(0, 1)),
    st.tuples(st.just("free"), st.integers(0, 50)),
    st.tuples(st.just("reserve"), st.integers(1, 8), st.integers(0, 12)),
    st.tuples(st.just("unreserve"), st.integers(0, 50))), max_size=60)


@settings(max_examples=60, deadline=None)
@given(_STEPS)
def test_allocations_go_to_the_lowest_free_place_whatever_came_before(steps):
    size = 24 * MIB  # small enough that regions fill
    arena = VaArena(BASE, size)
    arena.split(2)  # two devices: each allocation goes to its device's half
    taken: dict[int, int] = {}  # start -> rounded span, allocations and reservations
    live, reserved = [], []
    for step in steps:
        if step[0] == "alloc":
            _, n, alignment, region = step
            low = BASE + region * size // 2
            expected = _first_free(taken, n, alignment, low, low + size // 2)
            assert arena.alloc(n, alignment=alignment, region=region) == expected
            if expected is not None:
                taken[expected] = -(-max(n, 1) // 512) * 512
                live.append(expected)
        elif step[0] == "reserve":
            _, mib, slot = step
            wanted = BASE + slot * 2 * MIB
            got = arena.reserve(mib * MIB, 2 * MIB, wanted)
            free_there = all(s + n <= wanted or wanted + mib * MIB <= s
                             for s, n in taken.items()) and wanted + mib * MIB <= BASE + size
            assert got == (wanted if free_there else
                           _first_free(taken, mib * MIB, 2 * MIB, BASE, BASE + size))
            if got is not None:
                taken[got] = mib * MIB
                reserved.append(got)
        else:
            pool = live if step[0] == "free" else reserved
            if pool:
                address = pool.pop(step[1] % len(pool))
                del taken[address]
                (arena.free if step[0] == "free" else arena.unreserve)(address)
    assert sorted(a for a, _ in arena.allocations()) == sorted(live)


def test_small_allocations_pack_and_a_freed_hole_is_filled_first():
    arena = VaArena(BASE, 1 << 40)
    addresses = [arena.alloc(8) for _ in range(3000)]
    assert addresses == [BASE + 512 * i for i in range(3000)]
    arena.free(addresses[5])
    arena.free(addresses[6])
    assert arena.alloc(1024) == addresses[5] and arena.alloc(100) == BASE + 512 * 3000


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


def test_a_region_full_to_its_end_has_no_room_though_the_next_is_free():
    arena = VaArena(BASE, 16 * MIB)
    arena.split(2)
    assert arena.alloc(7 * MIB, region=0) == BASE
    assert arena.alloc(2 * MIB, region=0) is None  # it would reach into region 1
    assert arena.alloc(MIB, region=0) == BASE + 7 * MIB
    assert arena.alloc(2 * MIB, region=1) == BASE + 8 * MIB
