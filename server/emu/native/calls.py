"""Device-function calls, compiled by inlining the callee's code at each call.

The interpreter gives each function one frame in a thread's local memory (its `.param`
formals and return values, and the caller's `.param` argument variables, at the kernel's
`local_offsets`); a call copies the arguments into the callee's formals and the return
copies the results out. Inlined code does the same copies, so the bytes in local memory
are the interpreter's. A function's registers have one stack slot each for every call of
it: calls are never recursive here. A call through a register switches on the address
over the functions whose address the module takes (each inlined there). printf and assert
go to device_io.py. Recursion and the device runtime's functions (malloc, launches, ...)
are left to the interpreter (`NotCompiled`).
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import ListOperand, RegisterOperand, Symbol
from ..ptx_types import TYPES
from . import control, device_io
from .codegen import _CONTROL, _HANDLERS, I1, I64, P8, NotCompiled, ltype

__all__ = ["memcpy"]

INLINED_LIMIT = 20_000    # instructions a kernel may inline in all (LLVM compile time grows)


def _call(c, instr, pc: int) -> None:
    compiled = c.program.code[pc]
    results, arguments = _lists(instr)
    builtin = compiled.kind not in ("call", "icall")   # vprintf, malloc, ...
    # a call ends the interpreter's basic block; a built-in is an op within one
    after_call = c.fn.append_basic_block(f"after{pc}") if builtin else c.blocks[pc + 1]
    if instr.guard is not None:
        enter = c.fn.append_basic_block(f"call{pc}")
        c.b.cbranch(c.read(instr.guard, TYPES["pred"], instr), enter, after_call)
        c.b = ir.IRBuilder(enter)
    if builtin:
        device_io.lower(c, instr, _callee(instr), arguments, results)
        c.b.branch(after_call)
        c.b = ir.IRBuilder(after_call)
        return
    # Arguments from registers and constants go to the .param variables made for them
    # (as the interpreter's staged st.param), then every argument is copied to the callee.
    for operand, var in zip(arguments, compiled.arguments, strict=False):
        if not _is_param(operand):
            c.b.store(c.read(operand, var.type, instr), _typed(c, var), align=1)
    if compiled.kind == "call":
        _inline(c, instr, pc, compiled, compiled.callee)
    else:
        _dispatch(c, instr, pc, compiled)
    for operand, var in zip(results, compiled.results, strict=False):
        if not _is_param(operand):
            c.write(operand, var.type, c.b.load(_typed(c, var), align=1), instr)
    c.b.branch(after_call)


def _dispatch(c, instr, pc: int, compiled) -> None:
    """A call through a register: each function whose address the module takes is inlined
    behind a switch on the address; any other address faults (718) as on the interpreter."""
    target = next(op for op in instr.operands if isinstance(op, RegisterOperand))
    address = c.read(target, TYPES["u64"], instr)
    functions = c.program.module.functions
    candidates = sorted(name for name in c.program.address_taken()
                        if functions[name].body is not None and not functions[name].is_entry)
    returned = c.fn.append_basic_block(f"returned{pc}")
    bad = c.fn.append_basic_block(f"bad_call{pc}")
    switch = c.b.switch(address, bad)
    c.b = ir.IRBuilder(bad)
    control.fail(c, "call", address, instr.line)
    for name in candidates:
        block = c.fn.append_basic_block(f"call_{name}")
        switch.add_case(ir.Constant(I64, c.program.function_addresses[name]), block)
        c.b = ir.IRBuilder(block)
        _inline(c, instr, pc, compiled, name)
        c.b.branch(returned)
    c.b = ir.IRBuilder(returned)


def _inline(c, instr, pc: int, compiled, name: str) -> None:
    """Enter `name` from self.b: copy the arguments to its formals, its code, copy its
    return values out; leaves self.b after the return."""
    chain = c.inlining
    if name in chain:
        raise NotCompiled(f"{instr.text}: recursion ({name})", instr.line)
    entry, end = c.program.entries[name], c.program.ends[name]
    c.inlined += end - entry
    if c.inlined > INLINED_LIMIT:
        raise NotCompiled(f"{instr.text}: more than {INLINED_LIMIT} instructions inlined",
                          instr.line)
    callee = c.program.module.functions[name]
    for formal, var in zip(callee.params, compiled.arguments, strict=False):
        _copy(c, formal, var)
    outer = (c.blocks, c.returns)
    returned = c.fn.append_basic_block(f"return{pc}")
    c.returns = returned
    c.inlining = [*chain, name]
    c.emit_function(callee, entry, end)
    c.inlining = chain
    c.blocks, c.returns = outer
    c.b = ir.IRBuilder(returned)
    for var, value in zip(compiled.results, callee.returns, strict=False):
        _copy(c, var, value)


def _callee(instr) -> str:
    operands = list(instr.operands)
    if operands and isinstance(operands[0], ListOperand):
        operands.pop(0)
    return getattr(operands[0], "name", "?") if operands else "?"


def _lists(instr) -> tuple[list, list]:
    """(results, arguments) of a call, as the interpreter's `call` reads them."""
    operands = list(instr.operands)
    results: list = []
    if operands and isinstance(operands[0], ListOperand):
        results = operands.pop(0).elements
    operands.pop(0)    # the callee
    arguments = operands[0].elements if operands and isinstance(operands[0], ListOperand) \
        else []
    return results, arguments


def _is_param(operand) -> bool:
    return isinstance(operand, Symbol) and operand.variable is not None \
        and operand.variable.space == "param"


def _at(c, var):
    return c.b.gep(c.local, [ir.Constant(I64, c.kernel.local_offsets[id(var)])])


def _typed(c, var):
    return c.b.bitcast(_at(c, var), ltype(var.type).as_pointer())


def _copy(c, destination, source) -> None:
    """A .param variable's bytes into another (as many as both have): a call's frame copy."""
    size = min(destination.size, source.size)
    c.b.call(memcpy(c.module), [_at(c, destination), _at(c, source), ir.Constant(I64, size),
                                 ir.Constant(I1, 0)])


def memcpy(module: ir.Module) -> ir.Function:
    name = "llvm.memcpy.p0.p0.i64"
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(ir.VoidType(), [P8, P8, I64, I1]), name)


_HANDLERS["call"] = _call
_CONTROL.add("call")
