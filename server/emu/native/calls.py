"""Device-function calls, compiled by inlining the callee's code at each call.

The interpreter gives each function one frame in a thread's local memory (its `.param`
formals and return values, and the caller's `.param` argument variables, at the kernel's
`local_offsets`); a call copies the arguments into the callee's formals and the return
copies the results out. Inlined code does the same copies, so the bytes in local memory
are the interpreter's. A function's registers have one stack slot each for every call of
it: calls are never recursive here. Recursion, calls through a register and the runtime's
built-in functions (vprintf, malloc, ...) are left to the interpreter (`NotCompiled`).
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import ListOperand, Symbol
from ..ptx_types import TYPES
from .codegen import _CONTROL, _HANDLERS, I1, I64, P8, NotCompiled, ltype

__all__: list[str] = []

INLINED_LIMIT = 100_000   # instructions a kernel may inline in all (nested calls multiply)


def _call(c, instr, pc: int) -> None:
    compiled = c.program.code[pc]
    if compiled.kind == "icall":
        raise NotCompiled(f"{instr.text} through a register", instr.line)
    name = compiled.callee
    callee = c.program.module.functions[name]
    if not callee.defined:
        raise NotCompiled(f"{instr.text} to {name}", instr.line)
    chain = c.inlining
    if name in chain:
        raise NotCompiled(f"{instr.text}: recursion ({name})", instr.line)
    entry, end = c.program.entries[name], c.program.ends[name]
    c.inlined += end - entry
    if c.inlined > INLINED_LIMIT:
        raise NotCompiled(f"{instr.text}: more than {INLINED_LIMIT} instructions inlined",
                          instr.line)
    results, arguments = _lists(instr)
    after_call = c.blocks[pc + 1]
    if instr.guard is not None:
        enter = c.fn.append_basic_block(f"call{pc}")
        c.b.cbranch(c.read(instr.guard, TYPES["pred"], instr), enter, after_call)
        c.b = ir.IRBuilder(enter)
    for operand, formal in zip(arguments, callee.params, strict=False):
        _pass(c, instr, operand, formal, into_formal=True)
    outer = (c.blocks, c.returns)
    returned = c.fn.append_basic_block(f"return{pc}")
    c.returns = returned
    c.inlining = [*chain, name]
    c.emit_function(callee, entry, end)
    c.inlining = chain
    c.blocks, c.returns = outer
    c.b = ir.IRBuilder(returned)
    for operand, formal in zip(results, callee.returns, strict=False):
        _pass(c, instr, operand, formal, into_formal=False)
    c.b.branch(after_call)


def _lists(instr) -> tuple[list, list]:
    """(results, arguments) of a direct call, as the interpreter's `call` reads them."""
    operands = list(instr.operands)
    results: list = []
    if operands and isinstance(operands[0], ListOperand):
        results = operands.pop(0).elements
    operands.pop(0)    # the callee
    arguments = operands[0].elements if operands and isinstance(operands[0], ListOperand) \
        else []
    return results, arguments


def _pass(c, instr, operand, formal, into_formal: bool) -> None:
    """An argument into the callee's formal, or a return value out to the caller: a .param
    variable's bytes (as many as both have), or a register or constant through the
    formal's type (what the interpreter's staged st.param / ld.param do)."""
    b = c.b
    offsets = c.kernel.local_offsets
    at = b.gep(c.local, [ir.Constant(I64, offsets[id(formal)])])
    if isinstance(operand, Symbol) and operand.variable is not None \
            and operand.variable.space == "param":
        var = operand.variable
        other = b.gep(c.local, [ir.Constant(I64, offsets[id(var)])])
        source, destination = (other, at) if into_formal else (at, other)
        b.call(_memcpy(c.module), [destination, source,
                                   ir.Constant(I64, min(var.size, formal.size)),
                                   ir.Constant(I1, 0)])
        return
    typed = b.bitcast(at, ltype(formal.type).as_pointer())
    if into_formal:
        b.store(c.read(operand, formal.type, instr), typed, align=1)
    else:
        c.write(operand, formal.type, b.load(typed, align=1), instr)


def _memcpy(module: ir.Module) -> ir.Function:
    name = "llvm.memcpy.p0.p0.i64"
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(ir.VoidType(), [P8, P8, I64, I1]), name)


_HANDLERS["call"] = _call
_CONTROL.add("call")
