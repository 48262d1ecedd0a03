"""The barrier forms beyond bar.sync: `bar.arrive`, `bar.red` (popc, and, or), and
`bar.warp.sync` (handed to warps.py).

`bar.arrive` waits like `bar.sync`, as on the interpreter (a producer that arrives and a
consumer that syncs are released together). `bar.red` is a barrier whose threads leave a
mark with their predicate (2 + p in their bar.red exchange slot) when their turn ends there.
When the block loop opens the barriers, `vgpu_bar_red` counts the marks of the threads
waiting at a barrier (the interpreter's arrived threads: exited ones take no part) and
gives each of them the block's totals (true count << 32 | arrived count); each thread reads
its totals when it resumes and clears the slot.
"""

from __future__ import annotations

from llvmlite import ir

from ..ptx_types import TYPES
from .codegen import _HANDLERS, I1, I32, I64, P32, P64, NotCompiled, _barrier, _Mods
from .warps import RED_SLOT, WAITING, exchange_base, warp_sync

__all__ = ["REDUCE_IR", "reducer"]


def reducer(module: ir.Module) -> ir.Function:
    """`vgpu_bar_red(resume, threads, spill, spill stride, exchange slot, opening)`."""
    existing = module.globals.get("vgpu_bar_red")
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(ir.VoidType(), [P32, I64, P64, I64, I64, I1]),
                       "vgpu_bar_red")


REDUCE_IR = f"""
define internal void @vgpu_bar_red(ptr %resume, i64 %n, ptr %spill, i64 %stride, i64 %xbase,
                                   i1 %opens) noinline {{
entry:
  br i1 %opens, label %count, label %done
count:
  %t = phi i64 [0, %entry], [%t1, %count]
  %arrived = phi i64 [0, %entry], [%arrived1, %count]
  %true = phi i64 [0, %entry], [%true1, %count]
  %sp = getelementptr i32, ptr %resume, i64 %t
  %s = load i32, ptr %sp
  %pos = icmp sgt i32 %s, 0
  %low = icmp slt i32 %s, {WAITING}
  %waits = and i1 %pos, %low
  %row = mul i64 %t, %stride
  %at = add i64 %row, %xbase
  %slot = add i64 %at, {RED_SLOT}
  %rp = getelementptr i64, ptr %spill, i64 %slot
  %r = load i64, ptr %rp
  %marked = icmp uge i64 %r, 2
  %is = and i1 %waits, %marked
  %one = zext i1 %is to i64
  %arrived1 = add i64 %arrived, %one
  %bit = and i64 %r, 1
  %mine = select i1 %is, i64 %bit, i64 0
  %true1 = add i64 %true, %mine
  %t1 = add i64 %t, 1
  %more = icmp ult i64 %t1, %n
  br i1 %more, label %count, label %totals
totals:
  %high = shl i64 %true1, 32
  %both = or i64 %high, %arrived1
  br label %give
give:
  %g = phi i64 [0, %totals], [%g1, %give]
  %gsp = getelementptr i32, ptr %resume, i64 %g
  %gs = load i32, ptr %gsp
  %gpos = icmp sgt i32 %gs, 0
  %glow = icmp slt i32 %gs, {WAITING}
  %gwaits = and i1 %gpos, %glow
  %grow = mul i64 %g, %stride
  %gat = add i64 %grow, %xbase
  %gslot = add i64 %gat, {RED_SLOT}
  %grp = getelementptr i64, ptr %spill, i64 %gslot
  %gr = load i64, ptr %grp
  %gmarked = icmp uge i64 %gr, 2
  %gis = and i1 %gwaits, %gmarked
  %gnew = select i1 %gis, i64 %both, i64 %gr
  store i64 %gnew, ptr %grp
  %g1 = add i64 %g, 1
  %gmore = icmp ult i64 %g1, %n
  br i1 %gmore, label %give, label %done
done:
  ret void
}}
"""


def _wait(c, instr, pc: int, resumed: ir.Block | None = None) -> None:
    """End the thread's turn at a barrier (guard: NotCompiled; a barrier under a guard
    would need the guard's lanes to wait elsewhere)."""
    if instr.guard is not None or pc + 1 not in c.blocks:
        raise NotCompiled(instr.text, instr.line)
    c.barriers += 1
    c.suspend(c.b, c.barriers, resumed or c.blocks[pc + 1], c.saved_at(pc + 1))


def _arrive(c, instr, pc: int) -> None:
    mods = _Mods(instr)
    for flag in ("arrive", "aligned", "cta"):
        mods.take(flag)
    mods.done()
    if len(instr.operands) != 2:
        raise NotCompiled(instr.text, instr.line)
    for operand in instr.operands:
        c.read(operand, TYPES["u32"], instr)
    _wait(c, instr, pc)


def _reduce(c, instr, pc: int) -> None:
    mods = _Mods(instr)
    for flag in ("red", "aligned", "cta"):
        mods.take(flag)
    op = mods.take("popc", "and", "or")
    ptype = mods.type("up")
    mods.done()
    if op is None or len(instr.operands) not in (3, 4) \
            or (ptype.kind == "pred") == (op == "popc"):
        raise NotCompiled(instr.text, instr.line)
    b = c.b
    predicate = b.zext(c.read(instr.operands[-1], TYPES["pred"], instr), I64)
    c.red_sites += 1
    slot = b.gep(c.spill, [ir.Constant(I64, exchange_base(c) + RED_SLOT)])
    b.store(b.add(predicate, ir.Constant(I64, 2)), slot)
    resumed = c.fn.append_basic_block(f"bar_red{pc}")
    _wait(c, instr, pc, resumed)
    c.b = b = ir.IRBuilder(resumed)
    slot = b.gep(c.spill, [ir.Constant(I64, exchange_base(c) + RED_SLOT)])
    totals = b.load(slot)
    b.store(ir.Constant(I64, 0), slot)
    arrived = b.trunc(totals, I32)
    true = b.trunc(b.lshr(totals, ir.Constant(I64, 32)), I32)
    if op == "popc":
        c.write(instr.operands[0], ptype, true, instr)
    elif op == "and":
        c.write(instr.operands[0], ptype, b.icmp_unsigned("==", true, arrived), instr)
    else:
        c.write(instr.operands[0], ptype, b.icmp_unsigned("!=", true, ir.Constant(I32, 0)),
                instr)


def _bar(c, instr, pc: int) -> None:
    modifiers = instr.modifiers
    if "warp" in modifiers:
        warp_sync(c, instr, pc)
    elif "red" in modifiers:
        _reduce(c, instr, pc)
    elif "arrive" in modifiers:
        _arrive(c, instr, pc)
    else:
        _barrier(c, instr, pc)


_HANDLERS.update({"bar": _bar, "barrier": _bar})
