"""brx.idx and trap, and the faults of control flow in compiled code (not memory
accesses): a call through an address that is no device function (calls.py), brx.idx past
its table, trap, a printf string outside memory (device_io.py). The thread records the
code, the address and the line with a `why` past codegen's memory reasons; the runner words
the message as the interpreter's Fault does."""

from __future__ import annotations

from llvmlite import ir

from ..errors import (
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_INVALID_PC,
    CUDA_ERROR_LAUNCH_FAILED,
    CUDA_ERROR_NOT_SUPPORTED,
)
from ..ptx_types import TYPES
from .codegen import _CONTROL, _HANDLERS, FAULTED, I32, I64, WHY, NotCompiled, _Mods

__all__ = ["describe", "fail", "is_runtime"]

# why -> (code, head, reason); why numbers follow codegen's WHY
_FAULTS = {
    "call": (CUDA_ERROR_INVALID_PC, "call through 0x{address:x}",
             "the address is not a device function of the module"),
    "brx": (CUDA_ERROR_NOT_SUPPORTED, "brx.idx index out of range",
            "branch index beyond the target list"),
    "trap": (CUDA_ERROR_LAUNCH_FAILED, "trap instruction executed", "kernel trapped"),
    "pointer": (CUDA_ERROR_ILLEGAL_ADDRESS, "Invalid __global__ read at 0x{address:x}",
                "device library string or argument pointer is out of bounds"),
    # a bad free: the runner raises the heap's own error, which device_io keeps
    "runtime": (CUDA_ERROR_ILLEGAL_ADDRESS, "device runtime call failed", ""),
}
_KINDS = list(_FAULTS)


def fail(c, kind: str, address, line: int) -> None:
    """End the thread with fault `kind` (at self.b, which this terminates)."""
    code = _FAULTS[kind][0]
    zero = ir.Constant(I64, 0)
    c.b.call(c.record, [c.fault, ir.Constant(I64, code), address, zero, zero,
                        ir.Constant(I64, line), zero,
                        ir.Constant(I64, len(WHY) + _KINDS.index(kind))])
    c.b.ret(ir.Constant(I32, FAULTED))


def is_runtime(why: int) -> bool:
    """Whether a fault record's `why` is a failed device-runtime call (device_io.py)."""
    return why == len(WHY) + _KINDS.index("runtime")


def describe(why: int, address: int) -> tuple[str, str] | None:
    """(head, reason) of a control fault's record; None for a memory fault."""
    if why < len(WHY):
        return None
    _, head, reason = _FAULTS[_KINDS[why - len(WHY)]]
    return head.format(address=address & 0xFFFF_FFFF_FFFF_FFFF), reason


def _brx(c, instr, pc: int) -> None:
    """`brx.idx index, table`: a switch over the table's targets (backward ones through the
    loop check, as bra's)."""
    mods = _Mods(instr)
    mods.take("idx")
    mods.take("uni")
    mods.done()
    targets = c.program.code[pc].target_pcs
    if not targets or len(instr.operands) != 2:
        raise NotCompiled(instr.text, instr.line)
    index = c.read(instr.operands[0], TYPES["u32"], instr)
    jump = c.fn.append_basic_block(f"brx{pc}")
    if instr.guard is None:
        c.b.branch(jump)
    else:
        c.b.cbranch(c.read(instr.guard, TYPES["pred"], instr), jump, c.blocks[pc + 1])
    out_of_range = c.fn.append_basic_block(f"brx_range{pc}")
    b = ir.IRBuilder(jump)
    switch = b.switch(index, out_of_range)
    for k, target_pc in enumerate(targets):
        target = c.blocks[target_pc]
        if target_pc <= pc:
            target = c.loop_check(target, target_pc, pc)
        switch.add_case(ir.Constant(I32, k), target)
    c.b = ir.IRBuilder(out_of_range)
    fail(c, "brx", ir.Constant(I64, 0), instr.line)


def _trap(c, instr) -> None:
    _Mods(instr).done()
    trapped = c.fn.append_basic_block("trap")
    after = c.fn.append_basic_block("after_trap")
    c.b.branch(trapped)
    c.b = ir.IRBuilder(trapped)
    fail(c, "trap", ir.Constant(I64, 0), instr.line)
    c.b = ir.IRBuilder(after)


_HANDLERS.update({"brx": _brx, "trap": _trap})
_CONTROL.add("brx")
