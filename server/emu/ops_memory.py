"""Loads and stores: ld ldu st (every state space, .v2/.v4), prefetch prefetchu.

Memory-ordering and cache qualifiers (.volatile, .relaxed/.acquire/.release and their
scopes, .ca/.cg/.cs/.lu/.cv/.wb/.wt, .nc, .L1::*, .L2::*) are accepted and need no action:
the emulator executes one instruction at a time, so every access is already sequentially
consistent.
"""

from __future__ import annotations

import numpy as np

from .address_space import GENERIC_LOCAL_BASE, GENERIC_PARAM_BASE, GENERIC_SHARED_BASE
from .ir import Address, Immediate, Sink, Symbol, Vector
from .isa import CompileContext, Modifiers, opcode
from .operands import converter, reader, symbol_address, writer
from .ptx_types import TYPES
from .spaces import load, store
from .state import lane_count

__all__ = ["ORDERING_QUALIFIERS", "address_reader", "memory_modifiers"]

ORDERING_QUALIFIERS = frozenset({
    "volatile", "relaxed", "acquire", "release", "acq_rel", "weak", "mmio", "sc",
    "cta", "gpu", "sys", "cluster", "ca", "cg", "cs", "lu", "cv", "wb", "wt", "nc",
    "unified",
})
_GENERIC_BASE = {"global": 0, "const": 0, "shared": GENERIC_SHARED_BASE,
                 "local": GENERIC_LOCAL_BASE, "kparam": GENERIC_PARAM_BASE}
_SPACES = ("global", "shared", "local", "const", "param", "shared::cta")


def memory_modifiers(ctx: CompileContext) -> tuple[Modifiers, str, bool]:
    """Modifiers with ordering/cache qualifiers removed; the space; whether a cache-hint
    operand follows."""
    mods = Modifiers(ctx, ORDERING_QUALIFIERS)
    hint = False
    for flag in list(mods.flags):
        if flag.startswith(("L1::", "L2::")):
            mods.flags.remove(flag)
            hint |= flag == "L2::cache_hint"
    space = mods.take(*_SPACES) or "generic"
    return mods, ("shared" if space == "shared::cta" else space), hint


def address_reader(operand, space: str, ctx: CompileContext):
    """(space actually accessed, `read(state, lanes)` -> uint64 addresses or an int)."""
    if not isinstance(operand, Address):
        raise ctx.error("expected an address operand [..]")
    offset = operand.offset
    base = operand.base
    if base is None:
        value = offset & 0xFFFF_FFFF_FFFF_FFFF
        return space, lambda state, lanes: value
    if isinstance(base, Symbol):
        sym_space, address = symbol_address(base, ctx)
        if sym_space in ("function", "label"):
            raise ctx.error(f"{base.name!r} is not a variable")
        if space == "generic":
            if sym_space == "fparam":
                raise ctx.error(f"{base.name!r} has no generic address")
            window = _GENERIC_BASE[sym_space]
            return "generic", lambda state, lanes: window + address(state) + offset
        if space == "param":
            if sym_space not in ("kparam", "fparam"):
                raise ctx.error(f"{base.name!r} is not a parameter")
            return sym_space, lambda state, lanes: address(state) + offset
        if sym_space != space and {sym_space, space} != {"global", "const"}:
            raise ctx.error(f"{base.name!r} is in .{sym_space}, not .{space}")
        return space, lambda state, lanes: address(state) + offset
    if base.reg.type.kind == "pred" or base.negate:
        raise ctx.error("an address register must be an integer register")
    bits = base.reg.type.bits
    if bits not in (32, 64):
        raise ctx.error("an address register must be 32 or 64 bits wide")
    as_unsigned = TYPES[f"u{bits}"]
    read = reader(base, as_unsigned, ctx)
    widen = converter(as_unsigned, TYPES["u64"])  # addresses are unsigned: zero-extend
    add = np.uint64(offset & 0xFFFF_FFFF_FFFF_FFFF)
    if space == "param":
        if not ctx.function.is_entry:
            raise ctx.error("register-addressed .param access outside a kernel")
        space = "kparam"

    def read_address(state, lanes):
        value = read(state, lanes)
        if widen is not None:
            value = widen(value)
        return value + add if offset else value
    return space, read_address


def _elements(operand) -> list:
    return operand.elements if isinstance(operand, Vector) else [operand]


def _vector_width(mods: Modifiers, ctx) -> int:
    width = mods.take("v2", "v4")
    return int(width[1:]) if width else 1


@opcode("ld", "ldu")
def _ld(instr, ctx: CompileContext):
    mods, space, hint = memory_modifiers(ctx)
    count = _vector_width(mods, ctx)
    ptype = mods.type()
    mods.done()
    ctx.operand_count(3 if hint else 2)
    dsts = _elements(instr.operands[0])
    if len(dsts) != count:
        raise ctx.error(f"expected {count} destination(s)")
    writes = [writer(d, ptype, ctx) for d in dsts]
    where, address = address_reader(instr.operands[1], space, ctx)
    dtype = ptype.dtype if ptype.kind != "pred" else np.dtype(np.uint8)
    if ptype.kind == "pred":
        raise ctx.error("ld cannot load a predicate")
    base = instr.operands[1].base
    if where == "kparam" and isinstance(base, Symbol):
        return ctx.op(_uniform_param_load(address, dtype, count, writes))

    def run(state, lanes):
        values = load(state, where, address(state, lanes), dtype, count, lanes)
        if count == 1:
            writes[0](state, lanes, values)
        else:
            for k, write in enumerate(writes):
                write(state, lanes, values[:, k])
    return ctx.op(run)


def _uniform_param_load(address, dtype, count, writes):
    """A kernel parameter read by name: one value for every lane."""
    size = dtype.itemsize * count

    def run(state, lanes):
        start = address(state, lanes)
        values = state.ctx.params[start:start + size].view(dtype)
        for k, write in enumerate(writes):
            write(state, lanes, values[k])
    return run


@opcode("st")
def _st(instr, ctx: CompileContext):
    mods, space, hint = memory_modifiers(ctx)
    count = _vector_width(mods, ctx)
    ptype = mods.type()
    mods.done()
    ctx.operand_count(3 if hint else 2)
    srcs = _elements(instr.operands[1])
    if len(srcs) != count or any(isinstance(s, Sink) for s in srcs):
        raise ctx.error(f"expected {count} source value(s)")
    reads = [reader(s, ptype, ctx) for s in srcs]
    where, address = address_reader(instr.operands[0], space, ctx)
    dtype = ptype.dtype

    def run(state, lanes):
        k = lane_count(state, lanes)
        if count == 1:
            value = reads[0](state, lanes)
            values = value if np.ndim(value) else np.full(k, value, dtype)
        else:
            values = np.empty((k, count), dtype)
            for j, read in enumerate(reads):
                values[:, j] = read(state, lanes)
        store(state, where, address(state, lanes), values, lanes)
    return ctx.op(run)


@opcode("cp")
def _cp_async(instr, ctx: CompileContext):
    """cp.async: an asynchronous global->shared copy, done at once (commit/wait are then
    no-ops). A source size below the copy size zero-fills the rest, as PTX specifies."""
    if "mbarrier" in instr.modifiers:
        from .ops_mbarrier import cp_async_arrive  # it imports this module

        return cp_async_arrive(instr, ctx)
    mods = Modifiers(ctx)
    if not mods.has("async"):
        raise ctx.unsupported("only cp.async is supported")
    kind = mods.take("commit_group", "wait_group", "wait_all", "ca", "cg")
    if kind in ("commit_group", "wait_group", "wait_all"):
        mods.take("bulk")
        mods.done()
        return ctx.op(lambda state, lanes: None)
    for flag in list(mods.flags):
        if flag.startswith(("L2::", "shared", "global")):
            mods.flags.remove(flag)
    mods.done()
    ctx.operand_count(3, 4)
    _, dst = address_reader(instr.operands[0], "shared", ctx)
    _, src = address_reader(instr.operands[1], "global", ctx)
    size_operand = instr.operands[2]
    if not isinstance(size_operand, Immediate) or int(size_operand.value) not in (4, 8, 16):
        raise ctx.error("cp.async copies 4, 8 or 16 bytes")
    size = int(size_operand.value)
    read_fill = reader(instr.operands[3], TYPES["u32"], ctx) if len(instr.operands) == 4 \
        else None
    columns = np.arange(size)

    def run(state, lanes):
        k = lane_count(state, lanes)
        data = np.zeros((k, size), np.uint8)
        if read_fill is None:
            data[:] = load(state, "global", src(state, lanes), np.dtype(np.uint8), size, lanes)
        else:
            valid = np.broadcast_to(np.minimum(read_fill(state, lanes), size), (k,))
            reading = np.flatnonzero(valid > 0)
            if len(reading):
                sub = reading if lanes is None else lanes[reading]
                addrs = src(state, lanes)
                addrs = addrs[reading] if np.ndim(addrs) else addrs
                data[reading] = load(state, "global", addrs, np.dtype(np.uint8), size, sub)
            data[columns[None, :] >= valid[:, None]] = 0
        store(state, "shared", dst(state, lanes), data, lanes)
    return ctx.op(run)


@opcode("prefetch", "prefetchu")
def _prefetch(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mods.take("global", "local")
    mods.take("L1", "L2", "L2::evict_last", "L2::evict_normal", "tensormap")
    mods.done()
    ctx.operand_count(1)
    return ctx.op(lambda state, lanes: None)
