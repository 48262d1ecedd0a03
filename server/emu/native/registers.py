"""Which registers a PTX instruction reads and which it writes, for the analyses over a
kernel's body: liveness (codegen.py), strides along a row of lanes (row_checks.py) and
whether blocks may run as one row (speculative.py)."""

from __future__ import annotations

from ..ir import Address, RegisterOperand, Vector

__all__ = ["NO_DESTINATION", "destinations", "uses_and_kills"]

NO_DESTINATION = frozenset({"st", "red", "bra", "bar", "barrier", "ret", "exit"})


def destinations(instr) -> list[RegisterOperand]:
    """The registers an instruction writes (guarded or not)."""
    if instr.opcode in NO_DESTINATION or not instr.operands:
        return []
    first = instr.operands[0]
    found = first.elements if isinstance(first, Vector) else [first]
    if instr.pair is not None:
        found = [*found, instr.pair]
    return [op for op in found if isinstance(op, RegisterOperand)]


def _registers_in(operand) -> set[int]:
    if isinstance(operand, RegisterOperand):
        return {operand.reg.id}
    if isinstance(operand, Address):   # a texture's or surface's also holds coordinates
        return _registers_in(operand.base) | _registers_in(operand.coordinates)
    if isinstance(operand, Vector):
        return set().union(*(_registers_in(e) for e in operand.elements))
    return set()


def uses_and_kills(instr) -> tuple[set[int], set[int]]:
    """The registers an instruction reads, and those it always overwrites (a guarded write
    may leave the old value, so it kills nothing)."""
    operands = list(instr.operands)
    defined = {op.reg.id for op in destinations(instr)}
    # the first operand is the destination, unless the instruction writes none or writes
    # memory there (cp.async, mbarrier.init, prefetch: an address whose registers it reads)
    if instr.opcode not in NO_DESTINATION and operands and not isinstance(operands[0], Address):
        operands.pop(0)
    used = set().union(*(_registers_in(o) for o in operands)) if operands else set()
    if instr.guard is not None:
        used.add(instr.guard.reg.id)
        defined = set()
    return used, defined
