"""Operand readers and writers, built once per instruction at load.

A reader is `read(state, lanes) -> value` giving the operand as the instruction's type: a
numpy array with one element per executing lane, or a numpy scalar for values that are the
same in every lane (immediates, symbol addresses, %ntid). A writer is
`write(state, lanes, value)`. Readers and writers reconcile the instruction type with the
register's declared type: same size is a free `view`, a wider register is truncated on read
and sign/zero-extended (per the instruction type) on write, as PTX specifies for ld/st/cvt.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np

from .address_space import function_addresses
from .errors import PtxError
from .ir import Immediate, RegisterOperand, Sink, SpecialRegister, Symbol, Variable
from .isa import CompileContext
from .ptx_types import TYPES, PtxType, int_dtype
from .state import State
from .timers import clock_cycles, globaltimer_ns

__all__ = [
    "as_lanes",
    "converter",
    "immediate_value",
    "kernel_param_layout",
    "reader",
    "symbol_address",
    "writer",
]

_U32 = TYPES["u32"]
_U64 = TYPES["u64"]


def converter(src: PtxType, dst: PtxType) -> Callable | None:
    """Bit-level conversion of a `src` value to a `dst` value (None when nothing to do)."""
    if src.dtype == dst.dtype:
        return None
    if src.kind == "pred" or dst.kind == "pred":
        raise PtxError(f"cannot use a .{src.name} value as .{dst.name}")
    target = dst.dtype
    if src.bits == dst.bits:
        return lambda v: v.view(target)
    if src.bits > dst.bits:
        wide, small = int_dtype(src.bits, False), int_dtype(dst.bits, False)
        return lambda v: v.view(wide).astype(small).view(target)
    small, wide = int_dtype(src.bits, src.is_signed), int_dtype(dst.bits, src.is_signed)
    return lambda v: v.view(small).astype(wide).view(target)


def as_lanes(value, count: int) -> np.ndarray:
    """`value` as an array of `count` lanes (uniform scalars broadcast)."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return value
    return np.full(count, value)


def immediate_value(imm: Immediate, ptype: PtxType):
    """An immediate as a numpy scalar of `ptype` (integers wrap to the type's width)."""
    if ptype.kind == "pred":
        return np.bool_(bool(imm.value))
    if ptype.name in ("f32", "f64"):
        if imm.float_bits is not None and imm.float_width == ptype.bits:
            return np.array(imm.float_bits, int_dtype(ptype.bits, False)).view(ptype.dtype)[()]
        return ptype.dtype.type(imm.value)
    if ptype.name in ("f16", "bf16", "f16x2", "bf16x2") and imm.is_float:
        if ptype.name == "f16":
            return np.float16(imm.value).view(np.uint16)
        if ptype.name == "bf16":
            bits = struct.unpack("<I", struct.pack("<f", imm.value))[0]
            return np.uint16(bits >> 16)
    if imm.float_bits is not None:
        bits = imm.float_bits   # a float literal moved into an integer type keeps its bits
    elif imm.is_float:
        raise PtxError(f"float immediate {imm.value} used as .{ptype.name}")
    else:
        bits = int(imm.value)
    bits &= (1 << ptype.bits) - 1
    return np.array(bits, int_dtype(ptype.bits, False)).view(ptype.dtype)[()]


def reader(operand, ptype: PtxType, ctx: CompileContext) -> Callable:
    if isinstance(operand, RegisterOperand):
        return _register_reader(operand, ptype, ctx)
    if isinstance(operand, Immediate):
        try:
            const = immediate_value(operand, ptype)
        except PtxError as exc:
            raise ctx.error(str(exc)) from None
        return lambda state, lanes: const
    if isinstance(operand, SpecialRegister):
        return _special_reader(operand.name, ptype, ctx)
    if isinstance(operand, Symbol):
        space, address = symbol_address(operand, ctx)
        if space in ("fparam", "label"):
            raise ctx.error(f"the address of {operand.name!r} cannot be taken")
        dtype = ptype.dtype
        mask = (1 << ptype.bits) - 1
        unsigned = int_dtype(ptype.bits, False)
        return lambda state, lanes: np.array(address(state) & mask, unsigned).view(dtype)[()]
    raise ctx.unsupported(f"unsupported operand {operand!r}")


def _register_reader(operand: RegisterOperand, ptype: PtxType, ctx: CompileContext):
    reg = operand.reg
    index = reg.id
    if (reg.type.kind == "pred") != (ptype.kind == "pred"):
        raise ctx.error(f"register {reg.name} (.{reg.type.name}) used as .{ptype.name}")
    try:
        conv = converter(reg.type, ptype)
    except PtxError as exc:
        raise ctx.error(str(exc)) from None
    if operand.negate:
        if ptype.kind != "pred":
            raise ctx.error(f"'!' applies to predicates only, not {reg.name}")

        def read_negated(state, lanes):
            value = state.reg(index)
            return ~(value if lanes is None else value[lanes])
        return read_negated
    if conv is None:
        def read(state, lanes):
            value = state.regs[index]
            if value is None:
                value = state.reg(index)
            return value if lanes is None else value[lanes]
        return read

    def read_converted(state, lanes):
        value = state.regs[index]
        if value is None:
            value = state.reg(index)
        return conv(value if lanes is None else value[lanes])
    return read_converted


def writer(operand, ptype: PtxType, ctx: CompileContext) -> Callable:
    if isinstance(operand, Sink):
        return lambda state, lanes, value: None
    if not isinstance(operand, RegisterOperand) or operand.negate:
        raise ctx.error(f"destination must be a register, got {operand!r}")
    reg = operand.reg
    if (reg.type.kind == "pred") != (ptype.kind == "pred"):
        raise ctx.error(f"register {reg.name} (.{reg.type.name}) written as .{ptype.name}")
    try:
        conv = converter(ptype, reg.type)
    except PtxError as exc:
        raise ctx.error(str(exc)) from None
    index = reg.id
    dtype = reg.type.dtype

    def write(state: State, lanes, value):
        if conv is not None:
            value = conv(value)
        if lanes is None:
            if not isinstance(value, np.ndarray) or value.ndim == 0:
                value = np.full(state.n, value, dtype)
            elif value.dtype != dtype:
                raise TypeError(f"line {ctx.instr.line}: {value.dtype} written to {reg.name}")
            state.regs[index] = value
        else:
            old = state.regs[index]
            new = np.zeros(state.n, dtype) if old is None else old.copy()
            new[lanes] = value
            state.regs[index] = new
    return write


# -- special registers -----------------------------------------------------------------------

def _special_reader(name: str, ptype: PtxType, ctx: CompileContext) -> Callable:
    """Special registers read as u32 (u64 for the 64-bit ones), then converted."""
    if ptype.kind == "pred":
        raise ctx.error(f"{name} read as a predicate")
    fetch, src = _special_source(name, ctx)
    conv = converter(src, ptype)

    def read(state, lanes):
        value = fetch(state)
        if isinstance(value, np.ndarray) and lanes is not None:
            value = value[lanes]
        return value if conv is None else conv(value)
    return read


def _special_source(name: str, ctx: CompileContext) -> tuple[Callable, PtxType]:
    u32 = np.uint32
    axis = {"x": 0, "y": 1, "z": 2}
    base, _, component = name.partition(".")
    if component and component not in axis:
        raise ctx.error(f"unknown special register {name}")
    k = axis.get(component, -1)
    if component:
        if base == "%tid":
            return (lambda s: s.layout.tid[k]), _U32
        if base == "%ntid":
            return (lambda s: u32(s.ctx.launch.block[k])), _U32
        if base == "%ctaid":
            return (lambda s: s.ctaid[k]), _U32
        if base == "%nctaid":
            return (lambda s: u32(s.ctx.launch.grid[k])), _U32
        if base == "%clusterid":       # every cluster is a single block
            return (lambda s: s.ctaid[k]), _U32
        if base == "%nclusterid":
            return (lambda s: u32(s.ctx.launch.grid[k])), _U32
        if base == "%cluster_ctaid":
            return (lambda s: u32(0)), _U32
        if base == "%cluster_nctaid":
            return (lambda s: u32(1)), _U32
        raise ctx.error(f"unknown special register {name}")
    fixed32 = {
        "%nwarpid": 32, "%smid": 0, "%nsmid": 1, "%cluster_ctarank": 0,
        "%cluster_nctarank": 1, "%is_explicit_cluster": 0,
    }
    if name in fixed32:
        value = u32(fixed32[name])
        return (lambda s: value), _U32
    if name in ("%envreg1", "%envreg2"):
        # Where a cooperative launch's grid barrier lives (high and low halves), as the
        # driver passes it to cooperative groups' grid.sync(); 0 in other launches.
        shift = 32 if name == "%envreg1" else 0
        return (lambda s: u32((s.ctx.grid_workspace >> shift) & 0xFFFFFFFF)), _U32
    if name.startswith("%envreg") or (name.startswith("%pm") and not name.endswith("_64")):
        return (lambda s: u32(0)), _U32
    if name.startswith("%pm"):
        return (lambda s: np.uint64(0)), _U64
    table: dict[str, tuple[Callable, PtxType]] = {
        "%laneid": (lambda s: s.layout.laneid, _U32),
        "%warpid": (lambda s: s.layout.warpid, _U32),
        "%gridid": (lambda s: np.uint64(1), _U64),
        # cudaGetCurrentGraphExec: the device graph whose node the kernel is, else 0
        "%current_graph_exec": (lambda s: np.uint64(s.ctx.environment.graph
                                                    if s.ctx.environment else 0), _U64),
        "%clock": (lambda s: u32(clock_cycles() & 0xFFFFFFFF), _U32),
        "%clock_hi": (lambda s: u32(clock_cycles() >> 32), _U32),
        "%clock64": (lambda s: np.uint64(clock_cycles()), _U64),
        "%globaltimer": (lambda s: np.uint64(globaltimer_ns()), _U64),
        "%globaltimer_lo": (lambda s: u32(globaltimer_ns() & 0xFFFFFFFF), _U32),
        "%globaltimer_hi": (lambda s: u32(globaltimer_ns() >> 32), _U32),
        "%lanemask_eq": (lambda s: u32(1) << s.layout.laneid, _U32),
        "%lanemask_lt": (lambda s: s.layout.lanemask_lt, _U32),
        "%lanemask_le": (lambda s: s.layout.lanemask_lt | (u32(1) << s.layout.laneid), _U32),
        "%lanemask_gt": (lambda s: ~(s.layout.lanemask_lt | (u32(1) << s.layout.laneid)),
                         _U32),
        "%lanemask_ge": (lambda s: ~s.layout.lanemask_lt, _U32),
        "%dynamic_smem_size": (lambda s: u32(s.ctx.launch.shared_bytes), _U32),
        "%total_smem_size": (lambda s: u32(s.ctx.launch.shared_size), _U32),
        "%aggr_smem_size": (lambda s: u32(s.ctx.launch.shared_size), _U32),
        "%reserved_smem_offset_begin": (lambda s: u32(s.ctx.launch.shared_size), _U32),
    }
    if name not in table:
        raise ctx.error(f"special register {name} cannot be read here")
    return table[name]


# -- symbols ---------------------------------------------------------------------------------

def kernel_param_layout(params: list[Variable]) -> list[tuple[Variable, int]]:
    """(parameter, byte offset) of an entry's parameters: natural or declared alignment."""
    out = []
    offset = 0
    for p in params:
        offset = (offset + p.align - 1) // p.align * p.align
        out.append((p, offset))
        offset += p.size
    return out


def symbol_address(symbol: Symbol, ctx: CompileContext) -> tuple[str, Callable[[State], int]]:
    """The space a symbol lives in and how to find its address there at run time.

    Spaces: "global"/"const" (device address from the launch's symbol table), "shared" and
    "local" (offset in the block's / thread's memory, per kernel layout), "kparam" (offset
    in the kernel parameter buffer), "fparam" (a device function's or call sequence's
    .param variable: they live in local memory).
    """
    offset = symbol.offset
    var = symbol.variable
    if var is None:
        var = ctx.module.variables.get(symbol.name)
    if var is None:
        if symbol.name in ctx.module.functions:
            where = function_addresses(ctx.module.functions)[symbol.name] + offset
            return "function", lambda state: where
        if symbol.name in ctx.function.labels:
            return "label", lambda state: 0
        raise ctx.error(f"unknown symbol {symbol.name!r}")
    key = id(var)
    if var.space in ("global", "const"):
        name = var.name
        return var.space, lambda state: state.ctx.launch.symbols[name] + offset
    if var.space == "shared":
        return "shared", lambda state: state.ctx.launch.kernel.shared_offsets[key] + offset
    if var.space == "local":
        return "local", lambda state: state.ctx.launch.kernel.local_offsets[key] + offset
    if var.space == "param":
        if ctx.function.is_entry and any(p is var for p in ctx.function.params):
            where = dict((id(p), o) for p, o in kernel_param_layout(ctx.function.params))
            position = where[key] + offset
            return "kparam", lambda state: position
        return "fparam", lambda state: state.ctx.launch.kernel.local_offsets[key] + offset
    raise ctx.unsupported(f"symbol {symbol.name!r} in unsupported space .{var.space}")

