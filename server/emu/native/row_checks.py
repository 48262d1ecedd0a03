"""Addresses that step evenly along a row of lanes, for the fast pass (speculative.py): one
bounds check covers the row.

The fast pass runs a block's threads as a loop over x (a row: fixed y and z) that LLVM
vectorizes. Most kernels index with `blockIdx.x * blockDim.x + threadIdx.x` and the like, so
an access site's address is, over the row, lo + S * tid.x with S a constant (4 for floats):
checking the row's first and last address against the site's cached allocation covers
every lane between them, and the check is the same for every lane, so LLVM takes it out
of the loop instead of comparing 64-bit addresses lane by lane.

`lane_strides` finds the registers with such values: a register has stride S when every
one of its definitions is an integer operation of the forms below on operands with strides
(immediates, parameters, %ctaid, %ntid, %nctaid, %tid.y/z: 0; %tid.x: 1), in modular
arithmetic of the register's width. While the fast pass is compiled, `RowValues` keeps
each such register's value at tid.x = 0 (its "lo", the same for the whole row, so LLVM
hoists it out of the lane loop) and rewrites the register as lo + S * tid.x, which is its
value (the lanes then see the address as a plain induction variable).

A widening (mul.wide, cvt, mad.wide) is exact only if the 32-bit progression does not cross
the signed (or unsigned) limit within the row: the fast pass checks that once per row,
and a row where it does (indices near 2^31) misses, so its threads run checked. So does a
row whose first or last address is outside the cached allocation: the checked run looks
the allocation up, reports strays and faults as always.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import Address, Immediate, RegisterOperand, SpecialRegister, Symbol, Vector
from ..ptx_types import lookup_type
from .registers import destinations

__all__ = ["RowValues", "lane_strides"]

VARYING = "varying"      # a register whose value is no affine function of tid.x
# A row spans |S| * (lanes - 1) < 2^30 (a row has at most 1024 lanes: a block's x row, or a
# run of blocks', speculative.RUN_LANES): comparing its two ends tells whether it crosses a
# 32-bit limit.
MAX_STRIDE = 1 << 20
_INTEGER = frozenset("sub")   # PtxType kinds: signed, unsigned, bits
_UNIFORM_SPECIALS = {f"{base}.{axis}" for base in ("%ctaid", "%ntid", "%nctaid")
                     for axis in "xyz"} | {"%tid.y", "%tid.z"}
_CONTROL = frozenset({"bra", "brx", "call", "ret", "exit", "trap"})


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _form(instr):
    """(kind, operation type, operand types) of the integer forms followed, else None;
    kind: "copy", "add", "sub", "mul", "mad", "shl", "neg", "wide" (mul.wide), "mad_wide",
    "convert"."""
    types = [t for m in instr.modifiers if (t := lookup_type(m)) is not None]
    flags = {m for m in instr.modifiers if lookup_type(m) is None}
    if not types or any(t.kind not in _INTEGER or t.bits not in (32, 64) for t in types):
        return None
    op, ptype = instr.opcode, types[0]
    if len(types) == 2 and op == "cvt" and not flags:
        return "convert", types[0], [types[1]]
    if len(types) != 1:
        return None
    if op == "mov" and not flags or op == "cvta" and flags == {"to", "global"} \
            or op == "cvta" and flags == {"global"}:
        return "copy", ptype, [ptype]
    if op in ("add", "sub") and not flags:
        return op, ptype, [ptype, ptype]
    if op == "neg" and not flags and ptype.kind == "s":
        return "neg", ptype, [ptype]
    if op == "shl" and not flags and ptype.kind == "b":
        return "shl", ptype, [ptype, None]   # a shift count: an immediate only
    if op in ("mul", "mad") and flags == {"lo"}:
        return op, ptype, [ptype] * (2 if op == "mul" else 3)
    if op in ("mul", "mad") and flags == {"wide"} and ptype.bits == 32:
        wide = lookup_type(f"{ptype.kind}64")
        return ("wide" if op == "mul" else "mad_wide"), wide, \
            [ptype, ptype] + ([wide] if op == "mad" else [])
    return None


def _operand_stride(operand, ptype, strides: dict, defined: set):
    """An operand's stride read as `ptype`: an int, VARYING, or None (not known yet)."""
    if isinstance(operand, Immediate):
        return VARYING if operand.is_float else 0
    if isinstance(operand, SpecialRegister):
        if operand.name in _UNIFORM_SPECIALS:
            return 0
        return 1 if operand.name == "%tid.x" and ptype.bits == 32 else VARYING
    if not isinstance(operand, RegisterOperand) or operand.negate \
            or operand.reg.type.kind not in _INTEGER or operand.reg.type.bits != ptype.bits:
        return VARYING
    if operand.reg.id not in defined:
        return VARYING   # never written: undefined, nothing to follow
    return strides.get(operand.reg.id)


def _transfer(instr, strides: dict, defined: set):
    """The stride of what `instr` writes (every destination), VARYING, or None (an operand
    not known yet)."""
    if instr.opcode == "ld" and "param" in instr.modifiers and len(instr.operands) == 2 \
            and not isinstance(instr.operands[0], Vector) \
            and isinstance(instr.operands[1], Address) \
            and isinstance(instr.operands[1].base, Symbol):
        return 0   # a kernel parameter: the same for every thread
    form = _form(instr)
    if form is None or len(instr.operands) != len(form[2]) + 1:
        return VARYING
    kind, rtype, sources = form
    destination = instr.operands[0]
    if not isinstance(destination, RegisterOperand) or destination.reg.type.bits != rtype.bits \
            or destination.reg.type.kind not in _INTEGER:
        return VARYING
    operands = instr.operands[1:]
    if kind == "shl":
        count = operands[1]
        if not isinstance(count, Immediate) or count.is_float \
                or not 0 <= count.value < rtype.bits:
            return VARYING
        operands, sources = operands[:1], sources[:1]
    got = [_operand_stride(op, t, strides, defined) for op, t in zip(operands, sources,
                                                                      strict=True)]
    if VARYING in got:
        return VARYING
    if None in got:
        return None
    if kind in ("copy", "convert"):
        stride = got[0]
    elif kind == "add":
        stride = got[0] + got[1]
    elif kind == "sub":
        stride = got[0] - got[1]
    elif kind == "neg":
        stride = -got[0]
    elif kind == "shl":
        stride = got[0] << instr.operands[2].value
    else:   # a product (plus an addend): one factor uniform, the other's stride times it
        a, b = got[0], got[1]
        if a and b:
            return VARYING
        if a or b:
            factor = operands[1] if a else operands[0]
            if not isinstance(factor, Immediate):
                return VARYING   # a stride known only at run time
            # the factor as the product sees it (a .wide one extends it by its type)
            value = int(factor.value) & ((1 << sources[0].bits) - 1)
            if kind in ("mul", "mad") or sources[0].is_signed:
                value = _signed(value, sources[0].bits)
            stride = (a or b) * value
        else:
            stride = 0
        if len(got) == 3:
            stride += got[2]
    stride = _signed(stride, rtype.bits)
    return stride if abs(stride) <= MAX_STRIDE else VARYING


def lane_strides(body) -> dict[int, int]:
    """register id -> stride along a row of lanes (0: the same for the whole row), for the
    registers whose every definition in `body` (a loop-free kernel's) follows tid.x so."""
    defined = {op.reg.id for instr in body for op in destinations(instr)}
    strides: dict = {}
    while True:
        changed = stuck = False
        for instr in body:
            targets = destinations(instr)
            if not targets:
                continue
            stride = _transfer(instr, strides, defined)
            if stride is None:
                stuck = True
                continue
            if len(targets) != 1:
                stride = VARYING
            for target in targets:
                old = strides.get(target.reg.id)
                new = stride if old is None or old == stride else VARYING
                if new != old:
                    strides[target.reg.id] = new
                    changed = True
        if changed:
            continue
        if not stuck:
            break
        # Definitions still waiting on each other (r1 = r2 + 1, r2 = r1 + 1): no stride.
        for instr in body:
            if destinations(instr) and _transfer(instr, strides, defined) is None:
                for target in destinations(instr):
                    strides[target.reg.id] = VARYING
    return {reg: s for reg, s in strides.items() if s != VARYING}


def _compared(body, strides: dict) -> set[int]:
    """The strided registers an integer setp compares with a uniform value (a guard such as
    `i < n`) that every thread has written when it gets there: each definition unguarded,
    before the kernel's first branch (its row value then always holds the lane's; a guard
    on a register some path leaves unwritten is left to the lanes)."""
    control = next((k for k, instr in enumerate(body) if instr.opcode in _CONTROL),
                   len(body))
    later = {t.reg.id for instr in body[control:] for t in destinations(instr)}
    guarded = {t.reg.id for instr in body[:control] if instr.guard is not None
               for t in destinations(instr)}
    always = {t.reg.id for instr in body[:control] for t in destinations(instr)} \
        - later - guarded
    found = set()
    for instr in body:
        if instr.opcode != "setp" or len(instr.operands) != 3:
            continue
        given = [_given_stride(op, strides) for op in instr.operands[1:]]
        if sorted(s == 0 for s in given if s is not None) == [False, True]:
            found.update(op.reg.id for op, s in zip(instr.operands[1:], given, strict=True)
                         if s and isinstance(op, RegisterOperand) and op.reg.id in always)
    return found


def _given_stride(operand, strides: dict) -> int | None:
    """An operand's stride as `lane_strides` found it (None: varying)."""
    if isinstance(operand, Immediate):
        return None if operand.is_float else 0
    if isinstance(operand, SpecialRegister):
        return 0 if operand.name in _UNIFORM_SPECIALS else (
            1 if operand.name == "%tid.x" else None)
    if isinstance(operand, RegisterOperand) and not operand.negate:
        return strides.get(operand.reg.id)
    return None


def _addresses(body) -> set[int]:
    """The registers global and generic accesses take their addresses from."""
    found = set()
    for instr in body:
        if instr.opcode not in ("ld", "st"):
            continue
        if any(space in instr.modifiers for space in ("shared", "local", "param", "const",
                                                       "shared::cta")):
            continue
        operand = instr.operands[1 if instr.opcode == "ld" else 0]
        if isinstance(operand, Address) and isinstance(operand.base, RegisterOperand):
            found.add(operand.base.reg.id)
    return found


class RowValues:
    """The fast pass's row values: each strided register that an address depends on gets a
    stack slot holding its value at tid.x = 0."""

    def __init__(self, c, body):
        self.c = c
        strides = lane_strides(body)
        # Only what addresses depend on: follow the strided registers' definitions back.
        defining: dict[int, list] = {}
        for instr in body:
            for target in destinations(instr):
                defining.setdefault(target.reg.id, []).append(instr)
        self.guarded = _compared(body, strides)   # what uniform_compare may follow
        needed, work = set(), [r for r in _addresses(body) | self.guarded if strides.get(r)]
        while work:
            reg = work.pop()
            if reg in needed:
                continue
            needed.add(reg)
            for instr in defining.get(reg, []):
                work.extend(op.reg.id for op in instr.operands[1:]
                            if isinstance(op, RegisterOperand) and strides.get(op.reg.id))
        self.strides = {reg: strides[reg] for reg in needed}
        self.all_strides = strides   # every register's, for what compares read
        self.lows: dict[int, ir.AllocaInstr] = {}

    def stride(self, reg_id: int) -> int:
        return self.strides.get(reg_id, 0)

    def _low(self, operand, ptype, instr):
        """An operand's value at tid.x = 0."""
        c = self.c
        if isinstance(operand, SpecialRegister) and operand.name == "%tid.x":
            return ir.Constant(ir.IntType(32), 0)
        if isinstance(operand, RegisterOperand) and operand.reg.id in self.strides:
            return c.b.load(self._slot(operand.reg))
        return c.read(operand, ptype, instr)

    def _slot(self, reg):
        if reg.id not in self.lows:
            self.lows[reg.id] = self.c.deferred.entry.alloca(
                ir.IntType(reg.type.bits), name=reg.name.lstrip("%") + "_lo")
        return self.lows[reg.id]

    def last_lane(self, b):
        """The row's last tid.x: blockDim.x - 1, or a run of blocks' last lane's."""
        return b.sub(self.c.row_lanes, ir.Constant(ir.IntType(64), 1))

    def high(self, low, stride: int):
        """A 64-bit row value at the row's last lane (lo + S * last lane)."""
        b = self.c.b
        return b.add(low, b.mul(self.last_lane(b), ir.Constant(low.type, stride)))

    def _widened(self, operand, ptype, bits, instr):
        """An operand of a widening (cvt, mul.wide, mad.wide) as `bits` wide, at tid.x = 0;
        a strided one only if its row does not cross the 32-bit limit (else the thread
        misses)."""
        c, b = self.c, self.c.b
        low = self._low(operand, ptype, instr)
        extend = b.sext if ptype.is_signed else b.zext
        stride = self._stride_of(operand)
        if stride and ptype.bits < bits:
            span = b.mul(b.trunc(self.last_lane(b), low.type), ir.Constant(low.type, stride))
            high = b.add(low, span)
            compare = b.icmp_signed if ptype.is_signed else b.icmp_unsigned
            c.miss_unless(compare(">=" if stride > 0 else "<=", high, low))
        return extend(low, ir.IntType(bits)) if ptype.bits < bits else \
            (b.trunc(low, ir.IntType(bits)) if ptype.bits > bits else low)

    def _stride_of(self, operand) -> int:
        if isinstance(operand, SpecialRegister):
            return 1 if operand.name == "%tid.x" else 0
        if isinstance(operand, RegisterOperand):
            return self.stride(operand.reg.id)
        return 0

    def define(self, instr) -> None:
        """After `instr` ran (in the fast pass): if it writes a register addresses follow,
        its row value, and the register rewritten as lo + S * tid.x."""
        targets = destinations(instr)
        if len(targets) != 1 or targets[0].reg.id not in self.strides:
            return
        reg = targets[0].reg
        kind, rtype, sources = _form(instr)
        b = self.c.b
        operands = instr.operands[1:]
        if kind == "shl":
            low = b.shl(self._low(operands[0], sources[0], instr),
                        ir.Constant(ir.IntType(rtype.bits), operands[1].value))
        elif kind in ("wide", "mad_wide", "convert"):
            args = [self._widened(op, t, rtype.bits, instr)
                    for op, t in zip(operands, sources, strict=True)]
            low = args[0] if kind == "convert" else b.mul(args[0], args[1])
            if kind == "mad_wide":
                low = b.add(low, args[2])
        else:
            args = [self._low(op, t, instr) for op, t in zip(operands, sources, strict=True)]
            low = {"copy": lambda: args[0], "add": lambda: b.add(args[0], args[1]),
                   "sub": lambda: b.sub(args[0], args[1]),
                   "neg": lambda: b.sub(ir.Constant(args[0].type, 0), args[0]),
                   "mul": lambda: b.mul(args[0], args[1]),
                   "mad": lambda: b.add(b.mul(args[0], args[1]), args[2])}[kind]()
        b.store(low, self._slot(reg))
        b.store(self.at_lane(low, self.strides[reg.id]), self.c.regs[reg.id][0])

    def at_lane(self, low, stride: int):
        """lo + S * tid.x in low's width: the lane's value of a register with that row."""
        b = self.c.b
        x = self.c.lane_x if low.type.width == 64 else self.c.tid[0]
        return b.add(low, b.mul(x, ir.Constant(low.type, stride)))

    def uniform_compare(self, instr, relation: str, bits: int, signed: bool, per_lane):
        """`per_lane` (the lane's i1 of setp's `relation` on operands 1 and 2), known for the
        whole row where it can be: a strided value compared with a uniform one is monotone
        along a row that does not cross the compare's wrap point, so where it holds (or
        fails) at both ends it does at every lane. Said as row-invariant selects around the
        lane's compare, LLVM unswitches the lane loop on them: rows whose lanes all pass a
        guard such as `i < n` then run without masked loads and stores (which stream at
        half the speed on some CPUs). Both selects are needed: with the all-pass one alone
        (or an `or`), LLVM 20 keeps one masked loop; the pair doubles the compile time of
        such kernels (saxpy: 172 -> 294 ms)."""
        if relation not in ("<", "<=", ">", ">=") or bits not in (32, 64):
            return per_lane
        operands = instr.operands[1:3]
        strides = [self._stride_of(op) if isinstance(op, SpecialRegister)
                   or isinstance(op, RegisterOperand) and op.reg.id in self.guarded else 0
                   for op in operands]
        uniform = [_given_stride(op, self.all_strides) == 0 for op in operands]
        if not (strides[0] and uniform[1] or strides[1] and uniform[0]):
            return per_lane
        c, b = self.c, self.c.b
        k = 0 if strides[0] else 1
        ptype = lookup_type(("s" if signed else "u") + str(bits))
        low = self._low(operands[k], ptype, instr)
        if low.type.width != bits:
            return per_lane
        other = c.read(operands[1 - k], ptype, instr)
        stride = strides[k]
        compare = b.icmp_signed if signed else b.icmp_unsigned
        if bits == 32:   # the row's values in 64 bits, exact: within 32 bits, no wrap
            wide = (b.sext if signed else b.zext)(low, ir.IntType(64))
            high64 = self.high(wide, stride)
            least, most = (-(1 << 31), (1 << 31) - 1) if signed else (0, (1 << 32) - 1)
            i64 = ir.IntType(64)
            no_wrap = b.and_(b.icmp_signed(">=", high64, ir.Constant(i64, least)),
                             b.icmp_signed("<=", high64, ir.Constant(i64, most)))
            high = b.trunc(high64, low.type)
        else:
            high = self.high(low, stride)
            no_wrap = compare(">=" if stride > 0 else "<=", high, low)
        ends = [compare(relation, *((end, other) if k == 0 else (other, end)))
                for end in (low, high)]
        all_true = b.and_(no_wrap, b.and_(*ends))
        all_false = b.and_(no_wrap, b.not_(b.or_(*ends)))
        return b.select(all_true, ir.Constant(ir.IntType(1), 1),
                        b.select(all_false, ir.Constant(ir.IntType(1), 0), per_lane))

    def address(self, base: RegisterOperand, offset: int):
        """(address at tid.x = 0, stride) of [base + offset] when base is a 64-bit strided
        register, else None."""
        stride = self.stride(base.reg.id)
        if not stride or base.reg.type.bits != 64:
            return None
        low = self.c.b.load(self._slot(base.reg))
        return self.c.b.add(low, ir.Constant(low.type, offset & ((1 << 64) - 1))), stride
