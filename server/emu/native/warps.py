"""Warp instructions (shfl, vote, activemask, match, redux, bar.warp.sync) in compiled code.

Threads of a block run one at a time, so a warp instruction cannot see the other lanes'
values where it stands. It is a meeting point instead: the thread hands its operands to its
warp (its exchange slots, after its registers in the spill buffer), saves its live registers
and ends its turn with WAITING + the instruction's site number. After each pass over the
block, `vgpu_warps` looks at each warp: of the sites its threads wait at, the one with the
lowest number (sites are numbered in code order, inlined calls at their call's place: the
interpreter's order of call stacks and program counters) goes on: the lanes waiting there
form the group that executes it together, as the interpreter's lanes at one program point
do. Each of them gets the group's lane mask and READY + site, runs again, reads the others'
operands and computes its own result. Lanes that exited, wait elsewhere or skipped the
instruction (a false guard) take no part, as on the interpreter; `shfl` from a lane outside
the group reads what that lane handed over at its last warp instruction (the interpreter
reads its current register: they differ only for a source lane that is not executing).
`bar.warp.sync` (`__syncwarp`, tile sync) is such a meeting point with nothing to compute,
so lanes exchanging data through shared memory between two of them see each other's writes.
"""

from __future__ import annotations

from llvmlite import ir

from ..ptx_types import TYPES
from .codegen import _CONTROL, _HANDLERS, I1, I32, I64, P32, P64, NotCompiled, _Mods

__all__ = ["EXCHANGE_SLOTS", "READY", "RESOLVE_IR", "WAITING", "exchange_base", "resolver",
           "warp_sync"]

WAITING = 1 << 24      # a thread's turn ended at warp site k: WAITING + k
READY = 1 << 26        # its group may execute it: READY + k
EXCHANGE_SLOTS = 7
# What a thread hands over (the value, its membermask, shfl's b and c), and what the block
# loop gives it: its group's lane mask and a copy of the value that the group reads (a lane
# of the group that goes on to its next warp instruction overwrites its value before the
# lanes after it have read it). The last slot is bar.red's (barriers.py).
_VALUE, _MEMBER, _B, _C, _GROUP, _SHARED, RED_SLOT = range(EXCHANGE_SLOTS)
_U32, _PRED = TYPES["u32"], TYPES["pred"]


def exchange_base(c) -> int:
    """The first exchange slot in a thread's row of the spill buffer (after its registers)."""
    return c.spill_stride() - EXCHANGE_SLOTS


def resolver(module: ir.Module) -> ir.Function:
    """`vgpu_warps(resume, threads, spill, spill stride, exchange slot)`: let each warp's
    lowest waiting site go on; true if any did."""
    existing = module.globals.get("vgpu_warps")
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(I1, [P32, I64, P64, I64, I64]), "vgpu_warps")


RESOLVE_IR = f"""
define internal i1 @vgpu_warps(ptr %resume, i64 %n, ptr %spill, i64 %stride,
                               i64 %xbase) noinline {{
entry:
  br label %warp
warp:
  %w = phi i64 [0, %entry], [%wnext, %wdone]
  %any = phi i1 [false, %entry], [%any2, %wdone]
  %first = shl i64 %w, 5
  %more = icmp ult i64 %first, %n
  br i1 %more, label %scan, label %exit
scan:
  %left = sub i64 %n, %first
  %small = icmp ult i64 %left, 32
  %size = select i1 %small, i64 %left, i64 32
  br label %find
find:
  %l = phi i64 [0, %scan], [%l1, %find]
  %min = phi i32 [2147483647, %scan], [%min2, %find]
  %t = add i64 %first, %l
  %sp = getelementptr i32, ptr %resume, i64 %t
  %s = load i32, ptr %sp
  %ge = icmp sge i32 %s, {WAITING}
  %lt = icmp slt i32 %s, {READY}
  %waits = and i1 %ge, %lt
  %less = icmp slt i32 %s, %min
  %take = and i1 %waits, %less
  %min2 = select i1 %take, i32 %s, i32 %min
  %l1 = add i64 %l, 1
  %fmore = icmp ult i64 %l1, %size
  br i1 %fmore, label %find, label %found
found:
  %none = icmp eq i32 %min2, 2147483647
  br i1 %none, label %wdone, label %mark
mark:
  %lm = phi i64 [0, %found], [%lm1, %mark]
  %mask = phi i64 [0, %found], [%mask2, %mark]
  %tm = add i64 %first, %lm
  %spm = getelementptr i32, ptr %resume, i64 %tm
  %sm = load i32, ptr %spm
  %mine = icmp eq i32 %sm, %min2
  %bit = shl i64 1, %lm
  %bitm = select i1 %mine, i64 %bit, i64 0
  %mask2 = or i64 %mask, %bitm
  %ready = add i32 %min2, {READY - WAITING}
  %sm2 = select i1 %mine, i32 %ready, i32 %sm
  store i32 %sm2, ptr %spm
  %lm1 = add i64 %lm, 1
  %mmore = icmp ult i64 %lm1, %size
  br i1 %mmore, label %mark, label %tell
tell:
  %l3 = phi i64 [0, %mark], [%l31, %tell]
  %t3 = add i64 %first, %l3
  %sp3 = getelementptr i32, ptr %resume, i64 %t3
  %s3 = load i32, ptr %sp3
  %is = icmp eq i32 %s3, %ready
  %row = mul i64 %t3, %stride
  %slot = add i64 %row, %xbase
  %gslot = add i64 %slot, {_GROUP}
  %gp = getelementptr i64, ptr %spill, i64 %gslot
  %old = load i64, ptr %gp
  %new = select i1 %is, i64 %mask2, i64 %old
  store i64 %new, ptr %gp
  %vp = getelementptr i64, ptr %spill, i64 %slot
  %value = load i64, ptr %vp
  %sslot = add i64 %slot, {_SHARED}
  %sp4 = getelementptr i64, ptr %spill, i64 %sslot
  %kept = load i64, ptr %sp4
  %shared = select i1 %is, i64 %value, i64 %kept
  store i64 %shared, ptr %sp4
  %l31 = add i64 %l3, 1
  %tmore = icmp ult i64 %l31, %size
  br i1 %tmore, label %tell, label %wdone
wdone:
  %any2 = phi i1 [%any, %found], [true, %tell]
  %wnext = add i64 %w, 1
  br label %warp
exit:
  ret i1 %any
}}
"""


class _Meeting:
    """One warp instruction: `hand` its operands to the warp and wait for the group, then
    compute with `own`/`lane` reads, then `close`."""

    def __init__(self, c, instr, pc: int, values: dict[int, object]):
        self.c = c
        self.skip = None
        site = c.warp_sites
        c.warp_sites += 1
        if instr.guard is not None:   # lanes whose guard is false take no part
            go = c.fn.append_basic_block(f"warp{pc}")
            self.skip = c.fn.append_basic_block(f"warp_skip{pc}")
            c.b.cbranch(c.read(instr.guard, _PRED, instr), go, self.skip)
            c.b = ir.IRBuilder(go)
        self.stride = c.spill_stride()
        self.base = exchange_base(c)
        for slot, value in values.items():
            c.b.store(value, self._own(slot))
        resumed = c.fn.append_basic_block(f"warp_group{pc}")
        c.suspend(c.b, WAITING + site, resumed, c.saved_at(pc + 1), resumes_as=READY + site)
        c.b = ir.IRBuilder(resumed)
        b = c.b
        self.lane = b.and_(c.t, ir.Constant(I64, 31))
        self.group = b.trunc(b.load(self._own(_GROUP)), I32)

    def _own(self, slot: int):
        return self.c.b.gep(self.c.spill, [ir.Constant(I64, self.base + slot)])

    def own(self, slot: int):
        return self.c.b.load(self._own(slot))

    def lane_value(self, b, k, slot: int):
        """Lane k's exchange slot (k must be a lane of the thread's warp in the block)."""
        offset = b.add(b.mul(b.sub(k, self.lane), ir.Constant(I64, self.stride)),
                       ir.Constant(I64, self.base + slot))
        return b.load(b.gep(self.c.spill, [offset]))

    def over_lanes(self, initial: list, body) -> list:
        """Fold body(b, k, in_group, values) -> values over the lanes k = 0..31 of the warp;
        `in_group` says lane k executes the instruction with this thread."""
        c = self.c
        before = c.b.block
        loop = c.fn.append_basic_block("lanes")
        done = c.fn.append_basic_block("lanes_done")
        c.b.branch(loop)
        b = ir.IRBuilder(loop)
        k = b.phi(I64)
        values = [b.phi(v.type) for v in initial]
        for phi, value in zip(values, initial, strict=True):
            phi.add_incoming(value, before)
        k.add_incoming(ir.Constant(I64, 0), before)
        bit = b.shl(ir.Constant(I32, 1), b.trunc(k, I32))
        in_group = b.icmp_unsigned("!=", b.and_(self.group, bit), ir.Constant(I32, 0))
        new = body(b, k, in_group, [*values])
        for phi, value in zip(values, new, strict=True):
            phi.add_incoming(value, loop)
        following = b.add(k, ir.Constant(I64, 1))
        k.add_incoming(following, loop)
        b.cbranch(b.icmp_unsigned("<", following, ir.Constant(I64, 32)), loop, done)
        c.b = ir.IRBuilder(done)
        return new

    def member_value(self, b, k, in_group):
        """Lane k's handed value, read only from a lane of the group (own value else)."""
        return self.lane_value(b, b.select(in_group, k, self.lane), _SHARED)

    def close(self) -> None:
        if self.skip is not None:
            self.c.b.branch(self.skip)
            self.c.b = ir.IRBuilder(self.skip)


def _wide(b, value):
    return b.zext(value, I64) if value.type != I64 else value


def _member(c, instr, operand):
    if operand is None:
        return ir.Constant(I64, 0xFFFFFFFF)
    return c.b.zext(c.read(operand, _U32, instr), I64)


def _vote(c, instr, pc: int) -> None:
    mods = _Mods(instr)
    sync = mods.take("sync")
    mode = mods.take("all", "any", "uni", "ballot")
    ptype = mods.type("bp")
    mods.done()
    if mode is None or len(instr.operands) != (3 if sync else 2):
        raise NotCompiled(instr.text, instr.line)
    predicate = c.b.zext(c.read(instr.operands[1], _PRED, instr), I64)
    member = _member(c, instr, instr.operands[2] if sync else None)
    meeting = _Meeting(c, instr, pc, {_VALUE: predicate, _MEMBER: member})

    def body(b, k, in_group, values):
        true = b.icmp_unsigned("!=", meeting.member_value(b, k, in_group), ir.Constant(I64, 0))
        bit = b.shl(ir.Constant(I32, 1), b.trunc(k, I32))
        return [b.or_(values[0], b.select(b.and_(in_group, true), bit, ir.Constant(I32, 0)))]
    ballot, = meeting.over_lanes([ir.Constant(I32, 0)], body)
    b = c.b
    member = b.trunc(meeting.own(_MEMBER), I32)
    ballot = b.and_(ballot, member)
    active = b.and_(meeting.group, member)
    if mode == "ballot":
        c.write(instr.operands[0], ptype, ballot, instr)
    else:
        zero = ir.Constant(I32, 0)
        result = {"all": lambda: b.icmp_unsigned("==", ballot, active),
                  "any": lambda: b.icmp_unsigned("!=", ballot, zero),
                  "uni": lambda: b.or_(b.icmp_unsigned("==", ballot, zero),
                                       b.icmp_unsigned("==", ballot, active))}[mode]()
        c.write(instr.operands[0], _PRED, result, instr)
    meeting.close()


def _activemask(c, instr, pc: int) -> None:
    mods = _Mods(instr)
    ptype = mods.type("b")
    mods.done()
    meeting = _Meeting(c, instr, pc, {})
    c.write(instr.operands[0], ptype, meeting.group, instr)
    meeting.close()


def _match(c, instr, pc: int) -> None:
    mods = _Mods(instr)
    mods.take("sync")
    mode = mods.take("any", "all")
    ptype = mods.type("b")
    mods.done()
    if mode is None or len(instr.operands) != 3:
        raise NotCompiled(instr.text, instr.line)
    value = _wide(c.b, c.read(instr.operands[1], ptype, instr))
    meeting = _Meeting(c, instr, pc, {_VALUE: value,
                                      _MEMBER: _member(c, instr, instr.operands[2])})
    mine = meeting.own(_VALUE)
    member = c.b.trunc(meeting.own(_MEMBER), I32)

    def body(b, k, in_group, values):
        bit = b.shl(ir.Constant(I32, 1), b.trunc(k, I32))
        named = b.icmp_unsigned("!=", b.and_(member, bit), ir.Constant(I32, 0))
        equal = b.icmp_unsigned("==", meeting.member_value(b, k, in_group), mine)
        takes = b.and_(in_group, b.and_(named, equal))
        return [b.or_(values[0], b.select(takes, bit, ir.Constant(I32, 0)))]
    same, = meeting.over_lanes([ir.Constant(I32, 0)], body)
    b = c.b
    if mode == "any":
        c.write(instr.operands[0], TYPES["b32"], same, instr)
    else:
        participants = b.and_(meeting.group, member)
        uniform = b.icmp_unsigned("==", same, participants)
        c.write(instr.operands[0], TYPES["b32"],
                b.select(uniform, participants, ir.Constant(I32, 0)), instr)
        if instr.pair is not None:
            c.write(instr.pair, _PRED, uniform, instr)
    meeting.close()


def _redux(c, instr, pc: int) -> None:
    mods = _Mods(instr)
    mods.take("sync")
    op = mods.take("add", "min", "max", "and", "or", "xor")
    ptype = mods.type("usb")
    mods.done()
    if op is None or len(instr.operands) != 3:
        raise NotCompiled(instr.text, instr.line)
    signed = ptype.is_signed
    identity = {"add": 0, "or": 0, "xor": 0, "and": 0xFFFFFFFF,
                "min": 0x7FFFFFFF if signed else 0xFFFFFFFF,
                "max": 0x80000000 if signed else 0}[op]
    value = _wide(c.b, c.read(instr.operands[1], ptype, instr))
    meeting = _Meeting(c, instr, pc, {_VALUE: value,
                                      _MEMBER: _member(c, instr, instr.operands[2])})
    member = c.b.trunc(meeting.own(_MEMBER), I32)

    def body(b, k, in_group, values):
        bit = b.shl(ir.Constant(I32, 1), b.trunc(k, I32))
        named = b.icmp_unsigned("!=", b.and_(member, bit), ir.Constant(I32, 0))
        x = b.trunc(meeting.member_value(b, k, in_group), I32)
        acc = values[0]
        if op in ("min", "max"):
            compare = b.icmp_signed if signed else b.icmp_unsigned
            combined = b.select(compare("<" if op == "min" else ">", x, acc), x, acc)
        else:
            combined = getattr(b, {"add": "add", "and": "and_", "or": "or_",
                                   "xor": "xor"}[op])(acc, x)
        return [b.select(b.and_(in_group, named), combined, acc)]
    result, = meeting.over_lanes([ir.Constant(I32, identity)], body)
    c.write(instr.operands[0], ptype, result, instr)
    meeting.close()


def _shfl(c, instr, pc: int) -> None:
    mods = _Mods(instr)
    mods.take("sync")
    mode = mods.take("up", "down", "bfly", "idx")
    ptype = mods.type("b")
    mods.done()
    if mode is None or ptype.bits != 32 or len(instr.operands) not in (4, 5):
        raise NotCompiled(instr.text, instr.line)
    b = c.b
    values = {_VALUE: _wide(b, c.read(instr.operands[1], ptype, instr)),
              _B: _wide(b, c.read(instr.operands[2], _U32, instr)),
              _C: _wide(b, c.read(instr.operands[3], _U32, instr))}
    meeting = _Meeting(c, instr, pc, values)
    b = c.b
    lane = meeting.lane
    amount = b.and_(meeting.own(_B), ir.Constant(I64, 31))
    control = meeting.own(_C)
    segment = b.and_(b.lshr(control, ir.Constant(I64, 8)), ir.Constant(I64, 31))
    clamp = b.and_(control, ir.Constant(I64, 31))
    not_segment = b.xor(segment, ir.Constant(I64, -1))
    max_lane = b.or_(b.and_(lane, segment), b.and_(clamp, not_segment))
    if mode == "up":
        j = b.sub(lane, amount)
        valid = b.icmp_signed(">=", j, max_lane)
    else:
        j = {"down": lambda: b.add(lane, amount), "bfly": lambda: b.xor(lane, amount),
             "idx": lambda: b.or_(b.and_(lane, segment), b.and_(amount, not_segment))}[mode]()
        valid = b.icmp_signed("<=", j, max_lane)
    first = b.sub(c.t, lane)
    threads = c.launch_slot(25)
    size = b.sub(threads, first)
    valid = b.and_(valid, b.icmp_signed("<", j, size))
    source = b.select(valid, j, lane)
    result = b.trunc(meeting.lane_value(b, source, _SHARED), I32)
    c.write(instr.operands[0], ptype, result, instr)
    if instr.pair is not None:
        c.write(instr.pair, _PRED, valid, instr)
    meeting.close()


def warp_sync(c, instr, pc: int) -> None:
    """bar.warp.sync (barriers.py hands it over)."""
    mods = _Mods(instr)
    mods.take("warp")
    mods.take("sync")
    mods.done()
    if len(instr.operands) != 1:
        raise NotCompiled(instr.text, instr.line)
    c.read(instr.operands[0], TYPES["b32"], instr)
    _Meeting(c, instr, pc, {}).close()


_HANDLERS.update({"shfl": _shfl, "vote": _vote, "activemask": _activemask, "match": _match,
                  "redux": _redux})
_CONTROL.update({"shfl", "vote", "activemask", "match", "redux"})
