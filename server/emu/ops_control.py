"""Control flow and synchronization: bra brx.idx call (direct and through a register) ret
exit trap bar/barrier membar fence nanosleep.

Branches, calls, returns, exits and blocking barriers compile to control records that the
executor's scheduler interprets (see `executor.py`). `bar.sync a, b` with a thread count
waits for every thread of the block like `bar.sync a` (nvcc only emits counts equal to the
block size). The executor opens barriers only when no thread can run, so `bar.arrive` waits
there too: a producer that arrives and a consumer that syncs are released together, and a
later `bar.red` still sees every thread of the block arrive. Memory fences need nothing:
instructions execute one at a time.
"""

from __future__ import annotations

import numpy as np

from .errors import CUDA_ERROR_LAUNCH_FAILED
from .ir import Address, Immediate, Instruction, ListOperand, RegisterOperand, Symbol, Variable
from .isa import CompileContext, Compiled, Modifiers, find_compiler, opcode
from .operands import reader, writer
from .ops_builtin import BUILTINS
from .ptx_types import TYPES
from .state import Fault

__all__: list[str] = []

_PRED = TYPES["pred"]


@opcode("bra")
def _bra(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mods.take("uni")
    mods.done()
    ctx.operand_count(1)
    target = instr.operands[0]
    if not isinstance(target, Symbol) or target.name not in ctx.function.labels:
        raise ctx.error("branch target must be a label of this function")
    return ctx.control("bra", target=target.name)


@opcode("brx")
def _brx(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    if not mods.has("idx"):
        raise ctx.error("only brx.idx exists")
    mods.take("uni")
    mods.done()
    ctx.operand_count(2)
    table = instr.operands[1]
    if not isinstance(table, Symbol) or table.name not in ctx.function.branch_tables:
        raise ctx.error("brx.idx needs a .branchtargets label")
    targets = ctx.function.branch_tables[table.name]
    missing = [t for t in targets if t not in ctx.function.labels]
    if missing:
        raise ctx.error(f"unknown branch target(s) {', '.join(missing)}")
    return ctx.control("brx", index=reader(instr.operands[0], TYPES["u32"], ctx),
                       targets=targets)


@opcode("call")
def _call(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mods.take("uni")
    mods.done()
    operands = list(instr.operands)
    results: list = []
    if operands and isinstance(operands[0], ListOperand):
        results = operands.pop(0).elements
    if not operands:
        raise ctx.error("call needs a target")
    callee = operands.pop(0)
    arguments: list = []
    if operands and isinstance(operands[0], ListOperand):
        arguments = operands.pop(0).elements
    if isinstance(callee, RegisterOperand):
        return _indirect_call(ctx, callee, arguments, results, operands)
    if not isinstance(callee, Symbol):
        raise ctx.error("call target must be a function name")
    if operands:
        raise ctx.error("only an indirect call names a prototype or target list")
    function = ctx.module.functions.get(callee.name)
    if function is None:
        raise ctx.error(f"call to undeclared function {callee.name!r}")
    if len(arguments) != len(function.params) or len(results) > len(function.returns):
        raise ctx.error(f"call to {callee.name!r} does not match its declaration")
    before: list = []
    after: list = []
    argument_vars = [_param_variable(ctx, a, formal, before, store=True)
                     for a, formal in zip(arguments, function.params, strict=False)]
    result_vars = [_param_variable(ctx, r, formal, after, store=False)
                   for r, formal in zip(results, function.returns, strict=False)]
    if not function.defined:
        builtin = BUILTINS.get(callee.name)
        if builtin is None and callee.name.startswith(("__cudaCDP2", "cuda")):
            raise ctx.unsupported(f"the device runtime's {callee.name} is not implemented")
        if builtin is None:
            raise ctx.error(f"function {callee.name!r} is declared but never defined")
        made = builtin(ctx, argument_vars, result_vars)
        if isinstance(made, Compiled):  # one that waits (a grid barrier): results on release
            made.arrive = _staged(before, made.arrive, [])
            made.release = _staged([], made.release, after)
            return made
        if before or after:
            made = _staged(before, made, after)
        return ctx.op(made)
    return ctx.control("call", callee=callee.name, arguments=argument_vars,
                       results=result_vars, before=before, after=after)


def _indirect_call(ctx: CompileContext, target, arguments: list, results: list, rest: list):
    """`call (results), %reg, (arguments), prototype;` (function pointers, virtual
    functions): the executor finds the function at the address in each thread's register
    (see `address_space.function_addresses`). Arguments and results pass as for a direct
    call; the prototype (or target list) only restates the signature, which the callee's
    own declaration gives."""
    if len(rest) != 1 or not isinstance(rest[0], Symbol):
        raise ctx.error("an indirect call ends with a .callprototype label or a "
                        ".calltargets list")
    before: list = []
    after: list = []
    argument_vars = [_param_variable(ctx, a, _formal_for(ctx, a), before, store=True)
                     for a in arguments]
    result_vars = [_param_variable(ctx, r, _formal_for(ctx, r), after, store=False)
                   for r in results]
    return ctx.control("icall", index=reader(target, TYPES["u64"], ctx),
                       arguments=argument_vars, results=result_vars, before=before,
                       after=after)


def _formal_for(ctx: CompileContext, operand) -> Variable:
    """The formal parameter an indirect call's register or constant argument stands for: a
    scalar of the register's type (an immediate passes as .b64 unless a .param variable
    carries it)."""
    if isinstance(operand, RegisterOperand):
        ptype = operand.reg.type
    elif isinstance(operand, Symbol) and operand.variable is not None:
        return operand.variable
    else:
        ptype = TYPES["b64"]
    size = max(ptype.bits // 8, 1)
    return Variable("%formal", "param", ptype, size, size, ctx.instr.line)


def _param_variable(ctx: CompileContext, operand, formal: Variable, staged: list,
                    store: bool) -> Variable:
    """The caller's .param variable that passes `operand` to or from `formal`. PTX also
    allows registers and constants as call arguments (and registers as results); they pass
    through a .param variable made for them, written before the call with `st.param` or
    read after it with `ld.param` (compiled into `staged`)."""
    if isinstance(operand, Symbol) and operand.variable is not None \
            and operand.variable.space == "param":
        return operand.variable
    allowed = (RegisterOperand, Immediate) if store else (RegisterOperand,)
    if not isinstance(operand, allowed) or formal.is_array:
        raise ctx.error("call arguments and results must be .param variables, or registers "
                        "and constants passed to scalar parameters")
    var = Variable(f"%call{ctx.instr.line}.{len(ctx.function.variables)}", "param",
                   formal.type, formal.size, formal.align, ctx.instr.line)
    ctx.function.variables.append(var)
    address = Address(Symbol(var.name, variable=var))
    instr = Instruction("st" if store else "ld", ("param", formal.type.name),
                        [address, operand] if store else [operand, address], ctx.instr.line)
    staged.append(find_compiler(instr)(instr, CompileContext(ctx.module, ctx.function,
                                                              instr)).run)
    return var


def _staged(before: list, run, after: list):
    def staged_run(state, lanes):
        for stage in before:
            stage(state, lanes)
        run(state, lanes)
        for stage in after:
            stage(state, lanes)
    return staged_run


@opcode("ret", "exit")
def _ret_exit(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mods.take("uni")
    mods.done()
    ctx.operand_count(0)
    return ctx.control(instr.opcode)


@opcode("trap")
def _trap(instr, ctx: CompileContext):
    Modifiers(ctx).done()
    line = instr.line

    def run(state, lanes):
        lane = 0 if lanes is None else int(lanes[0])
        raise Fault(CUDA_ERROR_LAUNCH_FAILED, "trap instruction executed", "kernel trapped",
                    lane, line)
    return ctx.op(run)


@opcode("bar", "barrier")
def _bar(instr, ctx: CompileContext):
    # The forms, per the PTX ISA: bar.warp.sync membermask; and
    # {bar,barrier}{.cta}.{sync,arrive,red}{.aligned} (bar implies .aligned). The scope
    # modifiers come first in the text, so they are looked for before the operation.
    mods = Modifiers(ctx)
    if mods.has("warp"):
        if instr.opcode != "bar" or not mods.has("sync"):
            raise ctx.error("expected bar.warp.sync")
        mods.done()
        ctx.operand_count(1)
        reader(instr.operands[0], TYPES["b32"], ctx)  # the membermask must be a 32-bit value
        return ctx.op(lambda state, lanes: None)
    mods.take("cta")
    mods.take("aligned")
    kind = mods.take("sync", "arrive", "red")
    if kind is None and instr.opcode == "barrier":
        raise ctx.error("expected barrier.sync, .arrive or .red")
    kind = kind or "sync"  # plain `bar 0` is bar.sync
    mods.take("aligned")
    if kind in ("sync", "arrive"):
        mods.done()
        ctx.operand_count(*((1, 2) if kind == "sync" else (2,)))
        return ctx.control("bar")
    return _bar_red(instr, ctx, mods)


def _bar_red(instr, ctx: CompileContext, mods: Modifiers):
    op = mods.take("popc", "and", "or")
    if op is None:
        raise ctx.error("bar.red needs .popc, .and or .or")
    ptype = mods.type({"u32"} if op == "popc" else {"pred"})
    mods.done()
    ctx.operand_count(3, 4)
    write = writer(instr.operands[0], ptype, ctx)
    read = reader(instr.operands[-1], _PRED, ctx)

    def arrive(state, lanes):
        if state.barrier_values is None:
            state.barrier_values = np.zeros(state.n, bool)
            state.barrier_arrived = np.zeros(state.n, bool)
        ids = state.lane_ids(lanes)
        state.barrier_values[ids] = read(state, lanes)
        state.barrier_arrived[ids] = True

    def release(state, lanes):
        slots = state.layout.slot
        nblocks = state.nblocks
        true_count = np.bincount(slots, weights=state.barrier_values, minlength=nblocks)
        arrived = np.bincount(slots, weights=state.barrier_arrived, minlength=nblocks)
        mine = slots if lanes is None else slots[lanes]
        if op == "popc":
            write(state, lanes, true_count[mine].astype(np.uint32))
        elif op == "and":
            write(state, lanes, (true_count == arrived)[mine])
        else:
            write(state, lanes, (true_count > 0)[mine])
    return ctx.control("bar", arrive=arrive, release=release)


@opcode("membar", "fence", "nanosleep", "pmevent", "griddepcontrol", "brkpt")
def _no_effect(instr, ctx: CompileContext):
    if instr.opcode == "nanosleep":
        mods = Modifiers(ctx)
        mods.type({"u32"})
        mods.done()
        ctx.operand_count(1)
    elif instr.opcode in ("membar", "fence"):
        allowed = {"cta", "gl", "sys", "gpu", "cluster", "sc", "acq_rel", "proxy", "async",
                   "alias", "global", "shared::cta", "shared::cluster", "tensormap",
                   "release", "acquire", "mbarrier_init", "shared"}
        unknown = [m for m in instr.modifiers if m not in allowed]
        if unknown:
            raise ctx.unsupported(f"unsupported modifier(s) {', '.join(unknown)}")
    return ctx.op(lambda state, lanes: None)
