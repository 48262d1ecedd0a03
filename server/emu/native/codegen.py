"""One kernel of a loaded module as LLVM IR: per-thread code, and a block loop around it.

Each PTX register becomes a stack slot of its type (LLVM's mem2reg turns them into SSA
values); each PTX instruction becomes a few LLVM instructions with the same bit-level
semantics as the interpreter's numpy closures (see the emulator's README for the choices
CUDA leaves open: division by zero, shift clamping, saturating conversions, min/max of NaN
and signed zeros). What this slice does not translate raises `NotCompiled` naming the
instruction and its PTX line; the kernel then runs on the interpreter.

Threads run one after the other. A barrier ends a thread's turn: it saves its registers in
its spill slots and returns the barrier's number; once every thread of the block has
returned, each waiting one is called again with that number, restores its registers and
goes on after the barrier (exited threads count as arrived, as on a GPU).

The ABI shared with `runner.py` (all slots are int64):
  launch[]   0-2 grid, 3-5 block, 6 parameter buffer address, 7 its size, 8 allocation
             table address, 9 allocation count, 10 stop flag (cancel, or another worker's
             fault), 11 stray mode (0 fault, 1 report the first, 2 allow), 12 stray
             reported flag, 13-19 the stray (address, size, need, line, space, block,
             thread), 20 shared size, 21 local size, 22 dynamic shared bytes,
             23 shared bytes per block (0: none), 24 local bytes per thread (0: none),
             25 threads per block, 26 %current_graph_exec, 27 helpers to wake once a
             thread runs long (team.py; 0: none), 28 the function that wakes them,
             29 the device I/O callback
             (device_io.py), 30-31 the clocks' origins (special_registers.py),
             32+k the device address of the k-th module variable
             in `symbols`.
  table[]    5 slots an allocation: base, size, mapped span, host address, access.
  fault[]    0 code, 1 address, 2 size, 3 need (1 read, 3 write), 4 PTX line, 5 block,
             6 thread, 7 space (SPACES), 8 why (WHY), 9 the allocation's access.
  cache[]    3 slots a global access site: where `vgpu_lookup` puts the base, size and
             host address of the allocation it found (the sites' caches themselves are
             local variables of run_blocks, so LLVM keeps them in registers; each call
             starts them from cache[]).
  run_blocks(launch, shared, local, spill, resume, first, end, fault, cache) -> 0, or
             FAULTED with fault[] filled, or STOPPED when the stop flag was seen.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from ..address_space import GENERIC_LOCAL_BASE, GENERIC_PARAM_BASE, GENERIC_SHARED_BASE
from ..ir import Address, Immediate, RegisterOperand, Sink, SpecialRegister, Symbol, Vector
from ..operands import immediate_value, kernel_param_layout
from ..ops_memory import ORDERING_QUALIFIERS
from ..ptx_types import TYPES, PtxType, lookup_type
from .helpers import HELPERS_IR
from .registers import uses_and_kills
from .row_checks import RowValues
from .speculative import (
    MISSED,
    RUN_LANES,
    Deferred,
    eligible,
    joins_blocks,
    loop_metadata,
    speculative_block,
    vectorize_hint,
)

__all__ = ["FAULTED", "SPACES", "STOPPED", "WHY", "NotCompiled", "intrinsic", "kernel_ir"]

FAULTED, STOPPED = -1, -2
YIELDED = 1 << 30      # thread results from here up: it yielded in a loop, resume there
YIELD_EVERY = 1 << 16  # backward branches a thread takes before it lets the others run
SPACES = ("global", "shared", "local", "kparam")          # fault[7]
WHY = ("out of bounds", "misaligned", "denied")            # fault[8]
SYMBOL_SLOT = 32
_STOP_SLOT, _SHARED_SIZE, _LOCAL_SIZE, _DYN_SHARED = 10, 20, 21, 22
WAKE_SLOT, WAKE_FUNCTION_SLOT = 27, 28

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()
P8, P32, P64 = I8.as_pointer(), I32.as_pointer(), I64.as_pointer()
_U32, _U64 = TYPES["u32"], TYPES["u64"]
_WINDOWS = {"shared": GENERIC_SHARED_BASE, "local": GENERIC_LOCAL_BASE,
            "param": GENERIC_PARAM_BASE, "global": 0, "const": 0}
_SPACE_NAMES = ("global", "shared", "local", "const", "param", "shared::cta")


class NotCompiled(Exception):
    """An instruction (or operand form) this compiler does not translate yet."""

    def __init__(self, what: str, line: int):
        super().__init__(f"{what} (PTX line {line})")
        self.what = what
        self.line = line


def ltype(ptype: PtxType) -> ir.Type:
    if ptype.kind == "pred":
        return I1
    if ptype.name == "f32":
        return F32
    if ptype.name == "f64":
        return F64
    return ir.IntType(ptype.bits)


def intrinsic(module: ir.Module, name: str, ty: ir.Type, count: int = 1,
              ret: ir.Type | None = None) -> ir.Function:
    """LLVM's intrinsic `name` on `count` operands of type `ty` (returning `ret`, or `ty`),
    declared in `module` once."""
    suffix = {F32: "f32", F64: "f64"}.get(ty, str(ty))
    full = f"{name}.{ret}.{suffix}" if ret is not None else f"{name}.{suffix}"
    existing = module.globals.get(full)
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(ret or ty, [ty] * count), full)


def _i64(value) -> ir.Value:
    """An int, or an i64 value, as an i64 value."""
    return value if isinstance(value, ir.Value) else ir.Constant(I64, value)


def kernel_ir(program, kernel, name: str) -> tuple[str, list[str], int, int]:
    """(LLVM IR text defining `name` as run_blocks, the module variables in slot order, the
    number of global access sites: the cache run_blocks takes holds 3 slots for each, the
    spill buffer's int64 slots per thread)."""
    return _KernelCompiler(program, kernel, name).build()


class _Mods:
    """An instruction's type modifiers and flags; `done` refuses flags nobody took."""

    def __init__(self, instr, ignorable=frozenset()):
        self.instr = instr
        self.types = [t for m in instr.modifiers if (t := lookup_type(m)) is not None]
        self.flags = [m for m in instr.modifiers if lookup_type(m) is None
                      and m not in ignorable]

    def take(self, *names):
        for name in names:
            if name in self.flags:
                self.flags.remove(name)
                return name
        return None

    def type(self, kinds="subf", count=1) -> PtxType:
        """The type(s), which must be of `kinds` ("s", "u", "b", "f", "p" for .pred)."""
        allowed = {"p" if t.kind == "pred" else t.kind for t in self.types}
        if len(self.types) != count or not allowed <= set(kinds):
            raise NotCompiled(f"{self.instr.text}: operand types", self.instr.line)
        if any(t.kind == "f" and t.name not in ("f32", "f64") for t in self.types):
            raise NotCompiled(f"{self.instr.text}: half-precision types", self.instr.line)
        return self.types[0]

    def done(self):
        if self.flags:
            raise NotCompiled(f"{self.instr.text}: modifier .{self.flags[0]}", self.instr.line)


class _KernelCompiler:
    def __init__(self, program, kernel, name: str):
        self.program = program
        self.kernel = kernel
        self.fn_ir = kernel.function
        self.name = name
        self.symbols = sorted(kernel.global_symbols)
        self.param_offsets = {id(p): o for p, o in kernel_param_layout(self.fn_ir.params)}
        self.module = ir.Module(name=name)
        self.module.triple = ""
        self.barriers = 0   # a thread waiting at the k-th barrier returns k (from 1)
        self.yields = 0     # one yielding at the k-th loop check returns YIELDED + k
        # (resume number, block it continues in, registers it restores) of every place a
        # thread's turn can end and resume
        self.resumes: list[tuple[int, ir.Block, list]] = []
        self.calls = len(kernel.functions) > 1   # device functions are inlined (calls.py)
        self.returns: ir.Block | None = None     # where `ret` goes in an inlined function
        self.inlining = [kernel.function.name]   # the functions being inlined, outermost first
        self.inlined = 0                         # instructions inlined so far
        self.warp_sites = 0                      # warp instructions (warps.py)
        self.red_sites = 0                       # bar.red (barriers.py)
        self.sites = 0                    # global access sites, 3 cache slots each
        self.invariant_node = None
        self.live: dict[int, set[int]] | None = None   # pc -> registers live on entry
        self.extra_ir: dict[str, str] = {}    # helpers lowerings add (rounding.py), by name
        # While the speculative variant is compiled (speculative.py): its store sites.
        self.deferred: Deferred | None = None
        # The speculative variant's addresses already computed in the current PTX block
        # ((register, offset, space) -> value) and the pointers they were found at (id of
        # the value -> (value, pointer)): a load and a store of one address then use one
        # pointer, which LLVM must see to vectorize `y[i] = f(y[i])` without a conflict.
        self.addresses: dict[tuple, object] = {}
        self.pointers: dict[int, tuple] = {}
        # The fast pass's registers that step evenly along a row of lanes (row_checks.py),
        # and the addresses computed from them (id -> (address, its row value, stride)).
        self.rows: RowValues | None = None
        self.row_addresses: dict[int, tuple] = {}

    # -- module ------------------------------------------------------------------------------
    def build(self) -> tuple[str, list[str], int, int]:
        self.lookup = ir.Function(self.module, ir.FunctionType(
            P8, [P64, I64, I64, I64, P64, P64, I64, I64]), "vgpu_lookup")
        self.record = ir.Function(self.module, ir.FunctionType(
            ir.VoidType(), [P64, I64, I64, I64, I64, I64, I64, I64]), "vgpu_fault")
        thread = self._thread_function()
        spec = None
        if not self.barriers and not self.yields and not self.calls and eligible(
                self.program, self.kernel, self.fn_ir, self.end_pc):
            spec = self._speculative_function()
        self._block_loop(thread, spec)
        text = "\n".join(line for line in str(self.module).splitlines()
                         if not (line.startswith("declare") and '@"vgpu_' in line))
        text = loop_metadata(text)
        text += HELPERS_IR + warps.RESOLVE_IR + barriers.REDUCE_IR + "".join(self.extra_ir.values())
        return text, self.symbols, self.sites, self.spill_stride()

    def spill_stride(self) -> int:
        """int64 slots a thread has in the spill buffer: its registers, then what it hands
        its warp at a warp instruction (warps.py)."""
        exchanges = self.warp_sites or self.red_sites
        return max(len(self.regs), 1) + (warps.EXCHANGE_SLOTS if exchanges else 0)

    def _intrinsic(self, name: str, ty: ir.Type, count: int = 1, ret: ir.Type | None = None):
        return intrinsic(self.module, name, ty, count, ret)

    # -- the per-thread function ---------------------------------------------------------------
    def _speculative_function(self) -> ir.Function:
        """The per-thread code again, as speculative.py's fast pass runs it."""
        sites = self.sites
        self.sites = 0          # the same sites, so the same caches, as the checked code
        self.deferred = Deferred(None)   # its entry: the function's, once made
        self.rows = RowValues(self, self.fn_ir.body)
        try:
            fn = self._thread_function("_speculative")
        finally:
            self.deferred = None
            self.rows = None
        assert self.sites == sites, "the speculative variant has other access sites"
        return fn

    def _thread_function(self, suffix: str = "_thread") -> ir.Function:
        fnty = ir.FunctionType(I32, [P64, P8, P8, P64, I64, I64, I32, I32, I32, I32, I32, I32,
                                     P64, P64, P64, I64])
        fn = ir.Function(self.module, fnty, self.name + suffix)
        fn.linkage = "internal"
        fn.attributes.add("alwaysinline")
        # row_lanes: the lanes of the fast pass's row (row_checks.py), blockDim.x or a run
        # of blocks' (speculative.py); the checked code does not read it
        (self.L, self.shared, self.local, self.spill, self.t, self.lane_x, ty_, tz, cx, cy, cz,
         self.resume, self.fault, self.cache, self.site_cache, self.row_lanes) = fn.args
        self.fn = fn
        entry = fn.append_basic_block("entry")
        self.b = ir.IRBuilder(entry)
        # tid.x comes 64 bits wide: the fast pass's row values step with it (row_checks.py)
        self.tid = (self.b.trunc(self.lane_x, I32), ty_, tz)
        self.ctaid = (cx, cy, cz)
        self.budget = self.b.alloca(I64, name="budget")
        self.carry = self.b.alloca(I1, name="carry")   # the carry flag (lower_integer.py)
        self.b.store(ir.Constant(I1, 0), self.carry)
        # a texture fetch's coordinates and results (textures.py)
        self.texture_words = self.b.alloca(I32, 4, name="texture_words")
        if self.deferred is not None:
            self.deferred.entry = self.b
            self.exit_block = fn.append_basic_block("exit")
        self.regs = {}
        # Every function the kernel reaches has its own registers (calls are inlined and
        # never recursive, so one slot each serves every call).
        for function in self.kernel.functions:
            for reg in self.program.module.functions[function].registers:
                self.regs[reg.id] = (self.b.alloca(ltype(reg.type),
                                                   name=reg.name.lstrip("%")), reg.type)
        self.launch_values = {}
        entry_pc = self.kernel.entry_pc
        self.end_pc = self.program.ends[self.fn_ir.name]
        dispatch = self.b
        start = fn.append_basic_block("start")
        self.b = ir.IRBuilder(start)
        self.emit_function(self.fn_ir, entry_pc, self.end_pc)
        self._resume_dispatch(dispatch, start)
        if self.deferred is not None:
            self.deferred.commit(fn, ir.IRBuilder(self.exit_block), calls.memcpy(self.module))
        return fn

    def emit_function(self, function, entry_pc: int, end_pc: int) -> None:
        """The code of `function` (pcs entry_pc..end_pc), entered from where self.b is; a
        `ret` goes to self.returns (None: the thread's end). Leaves self.blocks mapping
        the function's block leaders."""
        body = function.body
        leaders = sorted(pc for pc in self.program.blocks if entry_pc <= pc < end_pc)
        self.blocks = {pc: self.fn.append_basic_block(f"pc{pc}") for pc in leaders}
        self.b.branch(self.blocks[entry_pc])
        for pc in range(entry_pc, end_pc):
            if pc in self.blocks:
                if pc != entry_pc and not self.b.block.is_terminated:
                    self.b.branch(self.blocks[pc])
                self.b = ir.IRBuilder(self.blocks[pc])
                self.forget_addresses()   # what was computed before need not dominate
            elif self.b.block.is_terminated:
                continue    # unreachable code after a transfer inside a block cannot happen
            index = pc - entry_pc
            if index < len(body):
                self._instruction(body[index], pc)
            else:
                self.leave()    # the implicit ret at a function's end
        if not self.b.block.is_terminated:
            self.leave()

    def leave(self) -> None:
        """`ret`: back to the inlined call's continuation, or the thread's end."""
        if self.returns is None:
            self.thread_exit(self.b)
        else:
            self.b.branch(self.returns)

    def thread_exit(self, b: ir.IRBuilder) -> None:
        """End the thread (exit, ret, the end of its code)."""
        if self.deferred is not None:
            b.branch(self.exit_block)   # its deferred stores are made there
        else:
            b.ret(ir.Constant(I32, 0))

    def forget_addresses(self) -> None:
        self.addresses.clear()
        self.pointers.clear()
        self.row_addresses.clear()

    def _resume_dispatch(self, builder: ir.IRBuilder, start: ir.Block) -> None:
        builder.position_at_end(builder.block)   # after allocas added since (goto_entry_block)
        builder.store(ir.Constant(I64, YIELD_EVERY), self.budget)
        if not self.resumes:
            builder.branch(start)
            return
        switch = builder.switch(self.resume, start)
        for number, block, saved in self.resumes:
            restore = self.fn.append_basic_block(f"resume{number}")
            switch.add_case(ir.Constant(I32, number), restore)
            b = ir.IRBuilder(restore)
            for k, (slot, ptype) in saved:
                bits = b.load(b.gep(self.spill, [ir.Constant(I64, k)]))
                b.store(_from_i64(b, bits, ptype), slot)
            b.branch(block)

    def suspend(self, b: ir.IRBuilder, number: int, block: ir.Block, saved: list,
                resumes_as: int | None = None) -> None:
        """End the thread's turn: save the registers `saved` (see `saved_at`), return
        `number`; called again with it (or with `resumes_as`: the block loop changes a
        waiting thread's number when it lets it go on), the thread restores them and goes
        on in `block`."""
        for k, (slot, ptype) in saved:
            b.store(_to_i64(b, b.load(slot), ptype), b.gep(self.spill, [ir.Constant(I64, k)]))
        self.resumes.append((number if resumes_as is None else resumes_as, block, saved))
        b.ret(ir.Constant(I32, number))

    def saved_at(self, pc: int):
        """(spill slot, (stack slot, type)) of the registers live on entry to `pc`: all of
        them inside inlined functions (liveness covers the kernel's own code)."""
        if self.calls:
            return list(enumerate(self.regs.values()))
        if self.live is None:
            self.live = _live_registers(self.program, self.kernel, self.fn_ir, self.end_pc)
        live = self.live[pc]
        return [(k, value) for k, (reg, value) in enumerate(self.regs.items()) if reg in live]

    # -- the block loop ------------------------------------------------------------------------
    def _block_loop(self, thread: ir.Function, spec: ir.Function | None) -> None:
        fnty = ir.FunctionType(I32, [P64, P8, P8, P64, P32, I64, I64, P64, P64])
        fn = ir.Function(self.module, fnty, self.name)
        L, shared, local, spill, resume, first, end, fault, cache = fn.args
        for pointer in (L, shared, local, spill, resume, fault, cache):
            pointer.add_attribute("noalias")   # separate buffers (runner.py)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        # Each global access site's cache (base, size, host address of the allocation it
        # last found; zeros: none): a local array that only the (inlined) thread code reads
        # and writes, so LLVM holds it in registers across threads and blocks. It starts as
        # what the worker's lookups last found (`cache`, which the runner clears when the
        # allocations change): a call's first block need not miss at every site.
        sites = b.alloca(ir.ArrayType(I64, 3 * max(self.sites, 1)))
        site_cache = b.bitcast(sites, P64)
        b.call(calls.memcpy(self.module), [b.bitcast(sites, P8), b.bitcast(cache, P8),
                                           ir.Constant(I64, 8 * 3 * self.sites),
                                           ir.Constant(I1, 0)])

        def slot(k):
            return b.load(b.gep(L, [ir.Constant(I64, k)]))
        gx, gy, bx, by = slot(0), slot(1), slot(3), slot(4)
        shared_stride, local_stride, threads = slot(23), slot(24), slot(25)
        memset = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [P8, I8, I64, I1]),
                             "llvm.memset.p0.i64")
        zero8, false = ir.Constant(I8, 0), ir.Constant(I1, 0)
        runs = spec is not None and joins_blocks(self.fn_ir.body)
        if spec is not None:   # speculative.py's marks: clear between calls
            marks = b.select(b.icmp_unsigned(">", threads, ir.Constant(I64, RUN_LANES)),
                             threads, ir.Constant(I64, RUN_LANES)) if runs else threads
            marks_bytes = b.mul(marks, ir.Constant(I64, 4))

            def clear_marks(b):
                b.call(memset, [b.bitcast(resume, P8), zero8, marks_bytes, false])
        if runs:
            # The fast pass may take blocks in runs (speculative.py): 1D blocks without
            # shared or local memory, as many as fit in RUN_LANES lanes.
            one = ir.Constant(I64, 1)
            alone = b.and_(b.and_(b.icmp_unsigned("==", by, one),
                                  b.icmp_unsigned("==", slot(5), one)),
                           b.icmp_unsigned("==", b.or_(shared_stride, local_stride),
                                           ir.Constant(I64, 0)))
            per_run = b.select(alone, b.udiv(ir.Constant(I64, RUN_LANES), bx), one)
        head = fn.append_basic_block("block")
        # The block's coordinates: divided out for the first block, then counted (three
        # 64-bit divisions per block weigh on kernels whose blocks are light).
        first_ctaid = (b.urem(first, gx), b.urem(b.udiv(first, gx), gy),
                       b.udiv(first, b.mul(gx, gy)))
        start = b.block
        b.branch(head)
        b.position_at_end(head)
        blk = b.phi(I64)
        blk.add_incoming(first, start)
        coordinates = [b.phi(I64) for _ in range(3)]
        for phi, value in zip(coordinates, first_ctaid, strict=True):
            phi.add_incoming(value, start)

        def next_block(b, count):
            """From the end of `count` blocks (never past the grid's x row) to the loop's
            head with the next one."""
            cx, cy, cz = coordinates
            x1 = b.add(cx, count)
            wrap_x = b.icmp_unsigned("==", x1, gx)
            y1 = b.add(cy, b.zext(wrap_x, I64))
            wrap_y = b.icmp_unsigned("==", y1, gy)
            following = (b.select(wrap_x, ir.Constant(I64, 0), x1),
                         b.select(wrap_y, ir.Constant(I64, 0), y1),
                         b.add(cz, b.zext(wrap_y, I64)))
            for phi, value in zip(coordinates, following, strict=True):
                phi.add_incoming(value, b.block)
            blk.add_incoming(b.add(blk, count), b.block)
            b.branch(head)
        body = fn.append_basic_block("block_body")
        finished = fn.append_basic_block("finished")
        b.cbranch(b.icmp_unsigned("<", blk, end), body, finished)
        ir.IRBuilder(finished).ret(ir.Constant(I32, 0))
        b.position_at_end(body)
        flag = b.load_atomic(b.gep(L, [ir.Constant(I64, _STOP_SLOT)]), "monotonic", 8)
        stop = fn.append_basic_block("stop")
        go = fn.append_basic_block("go")
        b.cbranch(b.icmp_unsigned("!=", flag, ir.Constant(I64, 0)), stop, go)
        ir.IRBuilder(stop).ret(ir.Constant(I32, STOPPED))
        b.position_at_end(go)
        ctaid = [b.trunc(v, I32) for v in coordinates]
        for pointer, size in ((shared, shared_stride), (local, b.mul(threads, local_stride))):
            # most kernels have neither: a branch costs less than a call per block
            with b.if_then(b.icmp_unsigned("!=", size, ir.Constant(I64, 0))):
                b.call(memset, [pointer, zero8, size, false])
        b.store(blk, b.gep(fault, [ir.Constant(I64, 5)]))
        phased = bool(self.resumes)
        if phased:
            b.call(memset, [b.bitcast(resume, P8), zero8, b.mul(threads, ir.Constant(I64, 4)),
                            false])
        go_end = b.block
        if spec is not None:
            count = ir.Constant(I64, 1)
            if runs:   # the blocks left in the call and in the grid's x row bound a run
                def smaller(x, y):
                    return b.select(b.icmp_unsigned("<", x, y), x, y)
                count = smaller(per_run, smaller(b.sub(end, blk), b.sub(gx, coordinates[0])))
            done = fn.append_basic_block("block_done")
            speculative_block(fn, b, spec, thread, {
                "L": L, "shared": shared, "local": local, "spill": spill, "resume": resume,
                "fault": fault, "cache": cache, "site_cache": site_cache, "bx": bx, "by": by,
                "bz": slot(5), "ctaid": ctaid, "block": blk, "blocks": count,
                "local_stride": local_stride,
                "nregs": ir.Constant(I64, self.spill_stride()),
                "vectorize": vectorize_hint(self.module), "clear_marks": clear_marks}, done)
            b.position_at_end(done)
            next_block(b, count)
            return
        phase = fn.append_basic_block("phase")
        b.branch(phase)
        b.position_at_end(phase)
        # One pass over the block's threads: each runs to its exit, its next barrier, warp
        # instruction or yield. Threads at a barrier run again only after a pass in which no
        # thread yielded and no warp instruction was pending: then every thread has exited
        # or reached a barrier. Warp instructions are resolved after each pass (warps.py).
        release = b.phi(I1)
        release.add_incoming(ir.Constant(I1, 0), go_end)
        loop = fn.append_basic_block("thread")
        before = b.block
        b.branch(loop)
        b.position_at_end(loop)
        t, tx, ty, tz, waiting, yielding = (b.phi(ty_) for ty_ in (I64, I64, I64, I64, I1, I1))
        for phi in (t, tx, ty, tz, waiting, yielding):
            phi.add_incoming(ir.Constant(phi.type, 0), before)
        status = b.gep(resume, [t])
        state = b.load(status) if phased else ir.Constant(I32, 0)
        at_barrier = b.and_(b.icmp_signed(">", state, ir.Constant(I32, 0)),
                            b.icmp_signed("<", state, ir.Constant(I32, warps.WAITING)))
        at_warp = b.and_(b.icmp_signed(">=", state, ir.Constant(I32, warps.WAITING)),
                         b.icmp_signed("<", state, ir.Constant(I32, warps.READY)))
        runnable = b.or_(b.and_(b.icmp_signed(">=", state, ir.Constant(I32, 0)),
                                b.not_(b.or_(at_barrier, at_warp))),
                         b.and_(at_barrier, release))
        still_waiting = b.or_(waiting, b.or_(at_barrier, at_warp))
        run = fn.append_basic_block("run")
        step = fn.append_basic_block("next_thread")
        skip = b.block
        b.cbranch(runnable, run, step)
        b.position_at_end(run)
        b.store(t, b.gep(fault, [ir.Constant(I64, 6)]))
        nregs = ir.Constant(I64, self.spill_stride())
        result = b.call(thread, [L, shared, b.gep(local, [b.mul(t, local_stride)]),
                                 b.gep(spill, [b.mul(t, nregs)]), t,
                                 tx, *(b.trunc(v, I32) for v in (ty, tz)), *ctaid, state,
                                 fault, cache, site_cache, bx])
        failed = fn.append_basic_block("failed")
        ran = fn.append_basic_block("ran")
        b.cbranch(b.icmp_signed("<", result, ir.Constant(I32, 0)), failed, ran)
        ir.IRBuilder(failed).ret(result)
        b.position_at_end(ran)
        waits = b.icmp_signed(">", result, ir.Constant(I32, 0))
        if phased:
            b.store(b.select(waits, result, ir.Constant(I32, -1)), status)
        waited = b.or_(waiting, waits)
        yielded = b.or_(yielding, b.icmp_signed(">=", result, ir.Constant(I32, YIELDED)))
        b.branch(step)
        b.position_at_end(step)
        now_waiting = b.phi(I1)
        now_waiting.add_incoming(still_waiting, skip)
        now_waiting.add_incoming(waited, ran)
        now_yielding = b.phi(I1)
        now_yielding.add_incoming(yielding, skip)
        now_yielding.add_incoming(yielded, ran)
        one = ir.Constant(I64, 1)
        tx1 = b.add(tx, one)
        wrap_x = b.icmp_unsigned("==", tx1, bx)
        ty1 = b.add(ty, b.zext(wrap_x, I64))
        wrap_y = b.icmp_unsigned("==", ty1, by)
        t.add_incoming(b.add(t, one), step)
        tx.add_incoming(b.select(wrap_x, ir.Constant(I64, 0), tx1), step)
        ty.add_incoming(b.select(wrap_y, ir.Constant(I64, 0), ty1), step)
        tz.add_incoming(b.add(tz, b.zext(wrap_y, I64)), step)
        waiting.add_incoming(now_waiting, step)
        yielding.add_incoming(now_yielding, step)
        after = fn.append_basic_block("phase_end")
        b.cbranch(b.icmp_unsigned("<", b.add(t, one), threads), loop, after)
        b.position_at_end(after)
        exchange = [resume, threads, spill, nregs, ir.Constant(I64, warps.exchange_base(self))]
        opens = b.not_(now_yielding)
        if self.warp_sites:
            opens = b.and_(opens, b.not_(b.call(warps.resolver(self.module), exchange)))
        if self.red_sites:   # the block's bar.red totals, for the threads it releases
            b.call(barriers.reducer(self.module), [*exchange, opens])
        release.add_incoming(opens, after)
        block_done = fn.append_basic_block("next_block")
        b.cbranch(now_waiting, phase, block_done)
        b.position_at_end(block_done)
        next_block(b, ir.Constant(I64, 1))

    # -- operands ----------------------------------------------------------------------------
    def launch_slot(self, slot: int):
        """A slot of the launch record that does not change during the launch."""
        return self.invariant(self.b.load(self.b.gep(self.L, [ir.Constant(I64, slot)])))

    def invariant(self, load):
        """Mark a load of memory the launch never writes (the launch record's fixed slots,
        kernel parameters), so LLVM may hoist it out of the thread and block loops."""
        if self.invariant_node is None:
            self.invariant_node = self.module.add_metadata([])
        load.set_metadata("invariant.load", self.invariant_node)
        return load

    def read(self, operand, ptype: PtxType, instr):
        b = self.b
        if isinstance(operand, RegisterOperand):
            slot, rtype = self.regs[operand.reg.id]
            if (rtype.kind == "pred") != (ptype.kind == "pred"):
                raise NotCompiled(f"{instr.text}: register type", instr.line)
            value = b.load(slot)
            if operand.negate:
                return b.not_(value)
            return _convert(b, value, rtype, ptype)
        if isinstance(operand, Immediate):
            return _constant(immediate_value(operand, ptype), ptype)
        if isinstance(operand, SpecialRegister):
            value, src = self._special(operand.name, instr)
            return _convert(b, value, src, ptype)
        if isinstance(operand, Symbol):
            space, address = self._symbol(operand, instr)
            if space not in ("global", "const", "shared", "local", "kparam"):
                raise NotCompiled(f"{instr.text}: address of {operand.name}", instr.line)
            return _convert(b, address, _U64, ptype)
        raise NotCompiled(f"{instr.text}: operand {type(operand).__name__}", instr.line)

    def write(self, operand, ptype: PtxType, value, instr) -> None:
        if isinstance(operand, Sink):
            return
        if not isinstance(operand, RegisterOperand):
            raise NotCompiled(f"{instr.text}: destination", instr.line)
        slot, rtype = self.regs[operand.reg.id]
        if (rtype.kind == "pred") != (ptype.kind == "pred"):
            raise NotCompiled(f"{instr.text}: register type", instr.line)
        self.b.store(_convert(self.b, value, ptype, rtype), slot)
        if self.addresses:
            for key in [k for k in self.addresses if k[0] == operand.reg.id]:
                del self.addresses[key]

    def _special(self, name: str, instr):
        base, _, component = name.partition(".")
        axis = {"x": 0, "y": 1, "z": 2}.get(component)
        b = self.b
        if axis is not None and base == "%tid":
            return self.tid[axis], _U32
        if axis is not None and base == "%ctaid":
            return self.ctaid[axis], _U32
        if axis is not None and base in ("%ntid", "%nctaid"):
            slot = (3 if base == "%ntid" else 0) + axis
            return b.trunc(self.launch_slot(slot), I32), _U32
        if name == "%laneid":
            return b.and_(b.trunc(self.t, I32), ir.Constant(I32, 31)), _U32
        if name == "%warpid":
            return b.lshr(b.trunc(self.t, I32), ir.Constant(I32, 5)), _U32
        fixed = {"%nwarpid": 32, "%smid": 0, "%nsmid": 1}
        if name in fixed:
            return ir.Constant(I32, fixed[name]), _U32
        return special_registers.read(self, name, instr)

    def _symbol(self, symbol: Symbol, instr):
        """(space, i64 address in that space) of a variable named as a value."""
        var = symbol.variable or self.program.module.variables.get(symbol.name)
        if var is None and symbol.name in self.program.function_addresses:
            # a device function's address (function pointers, calls through registers)
            address = self.program.function_addresses[symbol.name] + symbol.offset
            return "global", ir.Constant(I64, address)
        if var is None:
            raise NotCompiled(f"{instr.text}: symbol {symbol.name}", instr.line)
        offset = symbol.offset
        if var.space in ("global", "const"):
            slot = SYMBOL_SLOT + self.symbols.index(var.name)
            return var.space, self.b.add(self.launch_slot(slot), ir.Constant(I64, offset))
        if var.space == "shared":
            where = self.kernel.shared_offsets[id(var)] + offset
            return "shared", ir.Constant(I64, where)
        if var.space == "local":
            return "local", ir.Constant(I64, self.kernel.local_offsets[id(var)] + offset)
        if var.space == "param" and id(var) in self.param_offsets:
            return "kparam", ir.Constant(I64, self.param_offsets[id(var)] + offset)
        if var.space == "param" and id(var) in self.kernel.local_offsets:
            # call arguments and results, device functions' parameters: local memory
            return "local", ir.Constant(I64, self.kernel.local_offsets[id(var)] + offset)
        raise NotCompiled(f"{instr.text}: symbol in .{var.space}", instr.line)

    # -- instructions ------------------------------------------------------------------------
    def _instruction(self, instr, pc: int) -> None:
        handler = _HANDLERS.get(instr.opcode)
        if handler is None:
            raise NotCompiled(instr.text, instr.line)
        if instr.opcode in _CONTROL:
            handler(self, instr, pc)
            return
        if instr.guard is None:
            handler(self, instr)
            if self.rows is not None:
                self.rows.define(instr)
            return
        run = self.fn.append_basic_block(f"guarded{pc}")
        after = self.fn.append_basic_block(f"after{pc}")
        self.b.cbranch(self.read(instr.guard, TYPES["pred"], instr), run, after)
        self.b = ir.IRBuilder(run)
        handler(self, instr)
        if self.rows is not None:
            self.rows.define(instr)
        self.b.branch(after)
        self.b = ir.IRBuilder(after)
        self.forget_addresses()

    def next_block(self, pc: int) -> ir.Block:
        return self.blocks[pc + 1]

    def transfer(self, instr, pc: int, target: ir.Block) -> None:
        """Branch to `target` (when the guard holds), falling through to pc + 1 otherwise."""
        if instr.guard is None:
            self.b.branch(target)
        else:
            self.b.cbranch(self.read(instr.guard, TYPES["pred"], instr), target,
                           self.next_block(pc))

    def loop_check(self, target: ir.Block, target_pc: int, pc: int) -> ir.Block:
        """What a backward branch goes through: every YIELD_EVERY of them the thread returns
        STOPPED if the stop flag is set (a spinning kernel can be cancelled), else yields,
        so that a thread spinning on what a later thread of its block does (a lock, a flag)
        lets that thread run, as independent thread scheduling does. The first to get there
        wakes the helpers its launch left asleep, expecting it short (team.py): a block
        spinning on what a later block does finds that block running, and a launch longer
        than its last has every worker."""
        check = self.fn.append_basic_block(f"loop{pc}")
        b = ir.IRBuilder(check)
        left = b.sub(b.load(self.budget), ir.Constant(I64, 1))
        b.store(left, self.budget)
        turn_over = self.fn.append_basic_block(f"turn_over{pc}")
        b.cbranch(b.icmp_unsigned("==", left, ir.Constant(I64, 0)), turn_over, target)
        b = ir.IRBuilder(turn_over)
        helpers = b.atomic_rmw("xchg", b.gep(self.L, [ir.Constant(I64, WAKE_SLOT)]),
                               ir.Constant(I64, 0), "acquire")
        with b.if_then(b.icmp_unsigned("!=", helpers, ir.Constant(I64, 0))):
            wake = b.load(b.gep(self.L, [ir.Constant(I64, WAKE_FUNCTION_SLOT)]))
            b.call(b.inttoptr(wake, ir.FunctionType(ir.VoidType(), [P64]).as_pointer()),
                   [b.inttoptr(helpers, P64)])
        flag = b.load_atomic(b.gep(self.L, [ir.Constant(I64, _STOP_SLOT)]), "monotonic", 8)
        stop = self.fn.append_basic_block(f"stop{pc}")
        suspend = self.fn.append_basic_block(f"yield{pc}")
        b.cbranch(b.icmp_unsigned("!=", flag, ir.Constant(I64, 0)), stop, suspend)
        ir.IRBuilder(stop).ret(ir.Constant(I32, STOPPED))
        self.suspend(ir.IRBuilder(suspend), YIELDED + self.yields, target,
                     self.saved_at(target_pc))
        self.yields += 1
        return check

    def fail(self, code: int, address, size: int, need: int, line: int, space: str,
             why: str) -> None:
        if self.deferred is not None:   # the checked code runs the thread again
            self.b.ret(ir.Constant(I32, MISSED))
            return
        self.b.call(self.record, [self.fault, ir.Constant(I64, code), address,
                                  ir.Constant(I64, size), ir.Constant(I64, need),
                                  ir.Constant(I64, line), ir.Constant(I64, SPACES.index(space)),
                                  ir.Constant(I64, WHY.index(why))])
        self.b.ret(ir.Constant(I32, FAULTED))

    def miss_unless(self, good) -> None:
        """In the fast pass: end the thread as missed (it runs again, checked) unless `good`."""
        self._unless(self.b.not_(good), lambda: self.b.ret(ir.Constant(I32, MISSED)))

    # -- checked memory ------------------------------------------------------------------------
    def access(self, space: str, address, size: int, write: bool, line: int):
        """An i8* to `size` bytes at `address` in `space`, after the interpreter's checks."""
        need = 3 if write else 1
        b = self.b
        row = self.row_addresses.get(id(address))
        if row is not None and space in ("global", "const", "generic"):
            return self._row_access(space, address, row[1:], size, write, line)
        if size > 1:
            label = {"generic": "global", "const": "global"}.get(space, space)
            misaligned = b.icmp_unsigned("!=", b.and_(address, ir.Constant(I64, size - 1)),
                                         ir.Constant(I64, 0))
            self._unless(misaligned, lambda: self.fail(716, address, size, need, line, label,
                                                       "misaligned"))
        if space in ("global", "const"):
            pointer = self._global(address, size, need, line)
        elif space in ("shared", "local", "kparam"):
            pointer = self._window(space, address, size, need, line)
        else:
            pointer = self._generic(address, size, need, line)
        if self.deferred is None:
            return pointer
        if space not in ("shared", "local", "kparam"):
            self.pointers.setdefault(id(address), (address, pointer))
        if write:   # stored when the thread exits
            return self.deferred.pointer(self.b, pointer, size)
        return pointer

    def _row_access(self, space: str, address, row, size: int, write: bool, line: int):
        """The fast pass's access to an address that steps evenly along the row of lanes
        (row_checks.py): the row's first and last addresses checked once for all lanes."""
        b = self.b
        low, stride = row
        high = self.rows.high(low, stride)
        if size > 1:   # (a stride of whole sizes: every lane's address is the first's modulo it)
            checked = address if stride % size else low
            self.miss_unless(b.icmp_unsigned("==", b.and_(checked, ir.Constant(I64, size - 1)),
                                             ir.Constant(I64, 0)))
        if space == "generic":   # the whole row in the global part of the generic space
            window = ir.Constant(I64, GENERIC_SHARED_BASE)
            self.miss_unless(b.and_(b.icmp_unsigned("<", low, window),
                                    b.icmp_unsigned("<", high, window)))
        pointer = self._global(address, size, 3 if write else 1, line, (low, high, stride))
        self.pointers.setdefault(id(address), (address, pointer))
        if write:   # stored when the thread exits
            return self.deferred.pointer(b, pointer, size)
        return pointer

    def _unless(self, bad, on_bad) -> None:
        fault = self.fn.append_basic_block("fault")
        ok = self.fn.append_basic_block("ok")
        self.b.cbranch(bad, fault, ok)
        self.b.position_at_end(fault)
        on_bad()
        self.b.position_at_end(ok)

    def _inside(self, offset, limit, size):
        """offset + size <= limit without overflow: one compare with `limit - size` per
        access (the limit is usually the same for the whole launch, so LLVM hoists the
        rest out of loops). `size`: bytes, an int or an i64 value."""
        b = self.b
        width = _i64(size)
        fits = b.icmp_unsigned(">=", limit, width)
        return b.and_(fits, b.icmp_unsigned("<=", offset, b.sub(limit, width)))

    def _window(self, space: str, offset, size: int, need: int, line: int):
        b = self.b
        if space == "kparam" and need == 3:
            raise NotCompiled("st.param in a kernel", line)
        limit = {"shared": _SHARED_SIZE, "local": _LOCAL_SIZE, "kparam": 7}[space]
        if not (space == "kparam" and isinstance(offset, ir.Constant)
                and offset.constant + size <= self.kernel.param_size):
            # (a launch's parameter buffer has the kernel's size, executor.py refuses any
            # other: a read at a constant offset inside it needs no check, and stays
            # unconditional, so LLVM takes the parameters out of the thread loops)
            inside = self._inside(offset, self.launch_slot(limit), size)
            self._unless(b.not_(inside), lambda: self.fail(700, offset, size, need, line,
                                                           space, "out of bounds"))
        if space == "kparam":
            base = b.inttoptr(self.launch_slot(6), P8)
        else:
            base = self.shared if space == "shared" else self.local
        return b.gep(base, [offset])

    def _global(self, address, size: int, need: int, line: int, row=None):
        """The checked global access; in the fast pass with `row` (the row's first and last
        addresses and the stride), the row's check."""
        b = self.b
        cache, found = self._site()
        cached_base = b.load(cache)
        cached_size = b.load(b.gep(cache, [ir.Constant(I64, 1)]))
        offset = b.sub(address, cached_base)
        if row is None:
            hit = self._inside(offset, cached_size, size)
        else:   # no wrap from the first to the last, both inside: every lane inside
            low, high, stride = row
            hit = b.and_(b.icmp_unsigned(">=" if stride > 0 else "<=", high, low),
                         b.and_(self._inside(b.sub(low, cached_base), cached_size, size),
                                self._inside(b.sub(high, cached_base), cached_size, size)))
        if self.deferred is not None:   # a miss: the checked code runs the thread again
            self.miss_unless(hit)
            if id(address) in self.pointers:   # both allocations hold it: the same one
                return self.pointers[id(address)][1]
            host = b.inttoptr(b.load(b.gep(cache, [ir.Constant(I64, 2)])), P8)
            return b.gep(host, [offset])
        return self._through_site(cache, found, hit, offset, address, size, need, line, True)

    def global_or_null(self, address, size):
        """A host pointer to `size` (bytes, an int or an i64 value) readable at the global
        `address`, or null where no allocation holds them: for what checks that itself (a
        texture fetch reads zeros there), through an access site as `_global`'s."""
        b = self.b
        cache, found = self._site()
        offset = b.sub(address, b.load(cache))
        hit = self._inside(offset, b.load(b.gep(cache, [ir.Constant(I64, 1)])), size)
        return self._through_site(cache, found, hit, offset, address, size, 1, 0, False)

    def _site(self):
        """A new global access site: (its cache, the lookup's result slots). Each site
        remembers the allocation it last hit: a site usually walks one array, so its next
        access is checked with a compare."""
        cache = self.b.gep(self.site_cache, [ir.Constant(I64, 3 * self.sites)])
        found = self.b.gep(self.cache, [ir.Constant(I64, 3 * self.sites)])
        self.sites += 1
        return cache, found

    def _through_site(self, cache, found, hit, offset, address, size, need: int, line: int,
                      faults: bool):
        """The pointer: from the site's cache on a `hit`, else from `vgpu_lookup`, which the
        site then remembers; where nothing holds the bytes the kernel faults (`faults`) or
        the pointer is null."""
        b = self.b
        fast = self.fn.append_basic_block("hit")
        slow = self.fn.append_basic_block("miss")
        join = self.fn.append_basic_block("found")
        b.cbranch(hit, fast, slow)
        b.position_at_end(fast)
        host = b.inttoptr(b.load(b.gep(cache, [ir.Constant(I64, 2)])), P8)
        fast_pointer = b.gep(host, [offset])
        b.branch(join)
        b.position_at_end(slow)
        slow_pointer = b.call(self.lookup, [self.L, address, _i64(size), ir.Constant(I64, need),
                                            found, self.fault, ir.Constant(I64, line),
                                            ir.Constant(I64, 0)])
        failed = b.icmp_unsigned("==", slow_pointer, ir.Constant(P8, None))
        if faults:
            self._unless(failed, lambda: b.ret(ir.Constant(I32, FAULTED)))
        else:
            keep = self.fn.append_basic_block("keep")
            b.cbranch(failed, join, keep)
            b.position_at_end(keep)
        for k in range(3):   # a stray access (pointer, no entry) leaves found[] as it was
            index = ir.Constant(I64, k)
            b.store(b.load(b.gep(found, [index])), b.gep(cache, [index]))
        kept = b.block
        b.branch(join)
        b.position_at_end(join)
        pointer = b.phi(P8)
        pointer.add_incoming(fast_pointer, fast)
        pointer.add_incoming(slow_pointer, kept)
        if not faults:
            pointer.add_incoming(slow_pointer, slow)   # null
        return pointer

    def _generic(self, address, size: int, need: int, line: int):
        """Split by window (the top byte) as the interpreter's generic accesses are."""
        b = self.b
        tag = b.lshr(address, ir.Constant(I64, 56))
        join = self.fn.append_basic_block("generic")
        incoming = []
        rest = self.fn.append_basic_block("global")
        switch = b.switch(tag, rest)
        for space, base in (("shared", GENERIC_SHARED_BASE), ("local", GENERIC_LOCAL_BASE),
                            ("kparam", GENERIC_PARAM_BASE)):
            if space == "kparam" and need == 3:
                continue   # a store to the parameter window: it is an illegal global address
            block = self.fn.append_basic_block(space)
            switch.add_case(ir.Constant(I64, base >> 56), block)
            b.position_at_end(block)
            pointer = self._window(space, b.sub(address, ir.Constant(I64, base)), size, need,
                                   line)
            incoming.append((pointer, b.block))
            b.branch(join)
        b.position_at_end(rest)
        pointer = self._global(address, size, need, line)
        incoming.append((pointer, b.block))
        b.branch(join)
        b.position_at_end(join)
        phi = b.phi(P8)
        for value, block in incoming:
            phi.add_incoming(value, block)
        return phi

    def address(self, operand, space: str, instr):
        """(space accessed, i64 address) of an [address] operand, as `address_reader`."""
        if not isinstance(operand, Address) or operand.coordinates is not None:
            raise NotCompiled(f"{instr.text}: address form", instr.line)
        offset = ir.Constant(I64, operand.offset & 0xFFFF_FFFF_FFFF_FFFF)
        base = operand.base
        if base is None:
            return space, offset
        if isinstance(base, Symbol):
            sym_space, address = self._symbol(base, instr)
            if isinstance(address, ir.Constant):   # kept a constant: see _window
                address = ir.Constant(I64, (address.constant + offset.constant)
                                      & 0xFFFF_FFFF_FFFF_FFFF)
            else:
                address = self.b.add(address, offset)
            if space == "generic":
                window = _WINDOWS["param" if sym_space == "kparam" else sym_space]
                return "generic", self.b.add(address, ir.Constant(I64, window))
            if space == "param":
                return sym_space, address
            return space, address
        if base.negate or base.reg.type.bits not in (32, 64) or base.reg.type.kind == "pred":
            raise NotCompiled(f"{instr.text}: address register", instr.line)
        bits = base.reg.type.bits
        value = self.read(base, TYPES[f"u{bits}"], instr)
        if bits == 32:
            value = self.b.zext(value, I64)
        if space == "param":
            space = "kparam"
        key = (base.reg.id, operand.offset, space)
        if key in self.addresses:
            return space, self.addresses[key]
        address = self.b.add(value, offset)
        if self.deferred is not None:
            self.addresses[key] = address
            row = self.rows.address(base, operand.offset)
            if row is not None:
                self.row_addresses[id(address)] = (address, *row)
        return space, address


_CONTROL = {"bra", "ret", "exit", "bar", "barrier"}   # handlers that take the pc too


def _elements(operand) -> list:
    return operand.elements if isinstance(operand, Vector) else [operand]


def _memory_mods(instr) -> tuple[_Mods, str, int]:
    mods = _Mods(instr, ORDERING_QUALIFIERS)
    for flag in list(mods.flags):
        if flag.startswith("L1::") or flag == "L2::64B" or flag == "L2::128B" \
                or flag == "L2::256B":
            mods.flags.remove(flag)
    space = mods.take(*_SPACE_NAMES) or "generic"
    width = mods.take("v2", "v4")
    return mods, ("shared" if space == "shared::cta" else space), int(width[1:]) if width else 1


def _ordering(instr, where: str) -> str | None:
    """The LLVM ordering of a global ld/st that another block may race with (.volatile,
    .relaxed, .mmio, .acquire, .release): blocks run at once on several workers, so a block
    spinning on a flag another block sets must load it each time. None for a plain access,
    and for shared and local memory, which only the block's own worker touches."""
    if where not in ("global", "generic"):
        return None
    modifiers = instr.modifiers
    for name in ("acquire", "release"):
        if name in modifiers:
            return name
    if any(name in modifiers for name in ("volatile", "relaxed", "mmio")):
        return "monotonic"
    return None


def _ld(c: _KernelCompiler, instr) -> None:
    dsts = _elements(instr.operands[0])
    ptype, where, typed = _memory_access(c, instr, instr.operands[1], False)
    ordering = _ordering(instr, where)
    for k, dst in enumerate(dsts):
        pointer = c.b.gep(typed, [ir.Constant(I64, k)])
        if ordering is None:
            value = c.b.load(pointer, align=1)
        else:   # the access was checked for alignment to its whole size
            value = c.b.load_atomic(pointer, ordering, ptype.nbytes)
        if where == "kparam":
            c.invariant(value)
        c.write(dst, ptype, value, instr)


def _st(c: _KernelCompiler, instr) -> None:
    values = _elements(instr.operands[1])
    ptype, where, typed = _memory_access(c, instr, instr.operands[0], True)
    ordering = _ordering(instr, where)
    for k, value in enumerate(values):
        pointer = c.b.gep(typed, [ir.Constant(I64, k)])
        if ordering is None:
            c.b.store(c.read(value, ptype, instr), pointer, align=1)
        else:
            c.b.store_atomic(c.read(value, ptype, instr), pointer, ordering, ptype.nbytes)


def _memory_access(c: _KernelCompiler, instr, address, write: bool):
    """ld/st: (type, space accessed, typed pointer to the checked elements)."""
    mods, space, count = _memory_mods(instr)
    ptype = mods.type("subf")
    mods.done()
    if len(instr.operands) != 2:
        raise NotCompiled(f"{instr.text}: operands", instr.line)
    where, address = c.address(address, space, instr)
    pointer = c.access(where, address, ptype.nbytes * count, write, instr.line)
    return ptype, where, c.b.bitcast(pointer, ltype(ptype).as_pointer())


def _mov(c: _KernelCompiler, instr) -> None:
    mods = _Mods(instr)
    ptype = mods.type("subfp")
    mods.done()
    dst, src = instr.operands
    if isinstance(dst, Vector) or isinstance(src, Vector):
        _pack_unpack(c, instr, ptype, dst, src)
        return
    c.write(dst, ptype, c.read(src, ptype, instr), instr)


def _pack_unpack(c: _KernelCompiler, instr, ptype: PtxType, dst, src) -> None:
    """`mov.b64 d, {a, b}` and `mov.b64 {a, b}, d`: element k is bits [k*w, (k+1)*w)."""
    parts = dst.elements if isinstance(dst, Vector) else src.elements
    if ptype.kind != "b" or isinstance(dst, Vector) == isinstance(src, Vector):
        raise NotCompiled(f"{instr.text}: vector form", instr.line)
    width = ptype.bits // len(parts)
    element = TYPES[f"b{width}"]
    whole = ir.IntType(ptype.bits)
    b = c.b
    if isinstance(src, Vector):
        value = ir.Constant(whole, 0)
        for k, part in enumerate(parts):
            bits = b.zext(c.read(part, element, instr), whole)
            value = b.or_(value, b.shl(bits, ir.Constant(whole, k * width)))
        c.write(dst, ptype, value, instr)
        return
    value = c.read(src, ptype, instr)
    for k, part in enumerate(parts):
        piece = b.trunc(b.lshr(value, ir.Constant(whole, k * width)), ir.IntType(width))
        c.write(part, element, piece, instr)


_ATOMIC_RMW = {"add": "add", "exch": "xchg", "and": "and", "or": "or", "xor": "xor",
               "inc": "uinc_wrap", "dec": "udec_wrap"}


def _atom(c: _KernelCompiler, instr) -> None:
    """atom and red on global, shared and generic addresses: LLVM atomics, so blocks on
    several threads update memory atomically; within a block threads run in order, so the
    updates apply in thread order as the interpreter's do."""
    mods, space, count = _memory_mods(instr)
    op = mods.take("add", "min", "max", "inc", "dec", "and", "or", "xor", "exch", "cas")
    ptype = mods.type("subf")
    mods.done()
    is_red = instr.opcode == "red"
    operands = instr.operands if is_red else instr.operands[1:]
    if space not in ("global", "shared", "generic") or op is None or count != 1 \
            or len(operands) != 2 + (op == "cas") or (ptype.is_float and op not in (
                "add", "exch")):
        raise NotCompiled(instr.text, instr.line)
    value = c.read(operands[1], ptype, instr)
    where, address = c.address(operands[0], space, instr)
    pointer = c.access(where, address, ptype.nbytes, True, instr.line)
    b = c.b
    typed = b.bitcast(pointer, ltype(ptype).as_pointer())
    if op == "cas":
        swapped = b.cmpxchg(typed, value, c.read(operands[2], ptype, instr), "monotonic",
                            "monotonic")
        old = b.extract_value(swapped, 0)
    else:
        if op in ("min", "max"):
            name = op if ptype.is_signed else f"u{op}"
        else:
            name = "fadd" if ptype.is_float else _ATOMIC_RMW[op]
        old = b.atomic_rmw(name, typed, value, "monotonic")
    if not is_red:
        c.write(instr.operands[0], ptype, old, instr)


def _bit_count(kind: str):
    """popc, clz (u32 results) and brev (same type)."""
    def handler(c, instr):
        ptype, x = _typed_source(c, instr, "b")
        b = c.b
        if kind == "brev":
            c.write(instr.operands[0], ptype,
                    b.call(c._intrinsic("llvm.bitreverse", x.type), [x]), instr)
            return
        if kind == "popc":
            count = b.call(c._intrinsic("llvm.ctpop", x.type), [x])
        else:
            name = f"llvm.ctlz.{x.type}"
            ctlz = c.module.globals.get(name) or ir.Function(
                c.module, ir.FunctionType(x.type, [x.type, I1]), name)
            count = b.call(ctlz, [x, ir.Constant(I1, 0)])
        count = b.trunc(count, I32) if ptype.bits > 32 else count
        c.write(instr.operands[0], _U32, count, instr)
    return handler


def _cvta(c: _KernelCompiler, instr) -> None:
    mods = _Mods(instr)
    to = mods.take("to")
    space = mods.take(*_SPACE_NAMES)
    ptype = mods.type("u")
    mods.done()
    if space is None:
        raise NotCompiled(f"{instr.text}: no space", instr.line)
    window = _WINDOWS["shared" if space == "shared::cta" else space]
    value = c.read(instr.operands[1], ptype, instr)
    constant = ir.Constant(ltype(ptype), window & ((1 << ptype.bits) - 1))
    if window:
        value = c.b.sub(value, constant) if to else c.b.add(value, constant)
    c.write(instr.operands[0], ptype, value, instr)


def _binary(c: _KernelCompiler, instr, compute, kinds: str) -> None:
    mods = _Mods(instr)
    ptype = mods.type(kinds)
    mods.done()
    if len(instr.operands) != 3:
        raise NotCompiled(f"{instr.text}: operands", instr.line)
    a, b_ = (c.read(op, ptype, instr) for op in instr.operands[1:])
    c.write(instr.operands[0], ptype, compute(c.b, a, b_, ptype), instr)


def _arith(opcode_name: str):
    """Integer add/sub (their float forms and flags: lower_float.py, lower_integer.py)."""
    def handler(c, instr):
        def compute(b, x, y, ptype):
            return getattr(b, opcode_name)(x, y)
        _binary(c, instr, compute, kinds="bsu")
    return handler


def _widen(b, value, ptype: PtxType, bits: int):
    return (b.sext if ptype.is_signed else b.zext)(value, ir.IntType(bits))


def _div_rem(is_div: bool):
    def compute(b, x, y, ptype):
        zero = ir.Constant(x.type, 0)
        by_zero = b.icmp_unsigned("==", y, zero)
        one = ir.Constant(x.type, 1)
        if ptype.is_signed:
            minimum = ir.Constant(x.type, 1 << (ptype.bits - 1))
            overflow = b.and_(b.icmp_unsigned("==", x, minimum),
                              b.icmp_unsigned("==", y, ir.Constant(x.type, -1)))
            safe = b.select(b.or_(by_zero, overflow), one, y)
            if is_div:
                by_zero_result = b.select(b.icmp_signed(">=", x, zero),
                                          ir.Constant(x.type, -1), one)
                return b.select(by_zero, by_zero_result, b.sdiv(x, safe))
            return b.select(by_zero, x, b.srem(x, safe))
        safe = b.select(by_zero, one, y)
        if is_div:
            return b.select(by_zero, ir.Constant(x.type, -1), b.udiv(x, safe))
        return b.select(by_zero, x, b.urem(x, safe))

    def handler(c, instr):
        _binary(c, instr, compute, kinds="su")
    return handler


def _min_max(is_min: bool):
    """Integer min/max (float forms: lower_float.py)."""
    def compute(b, x, y, ptype):
        cmp = b.icmp_signed if ptype.is_signed else b.icmp_unsigned
        return b.select(cmp("<" if is_min else ">", x, y), x, y)

    def handler(c, instr):
        _binary(c, instr, compute, kinds="su")
    return handler


def _logic(name: str):
    def compute(b, x, y, ptype):
        return getattr(b, name)(x, y)

    def handler(c, instr):
        mods = _Mods(instr)
        ptype = mods.types[0] if len(mods.types) == 1 else None
        if ptype is not None and ptype.kind == "pred":
            mods.done()
            x, y = (c.read(op, ptype, instr) for op in instr.operands[1:])
            c.write(instr.operands[0], ptype, compute(c.b, x, y, ptype), instr)
            return
        _binary(c, instr, compute, kinds="bsu")
    return handler


def _not(c: _KernelCompiler, instr) -> None:
    mods = _Mods(instr)
    ptype = mods.types[0] if len(mods.types) == 1 else mods.type("bsu")
    if ptype.kind == "f":
        raise NotCompiled(instr.text, instr.line)
    mods.done()
    c.write(instr.operands[0], ptype, c.b.not_(c.read(instr.operands[1], ptype, instr)),
            instr)


def _typed_source(c: _KernelCompiler, instr, kinds: str):
    """(type, first source value) of an instruction with one type of `kinds` and no other
    modifier."""
    mods = _Mods(instr)
    ptype = mods.type(kinds)
    mods.done()
    return ptype, c.read(instr.operands[1], ptype, instr)


def _neg_abs(is_neg: bool):
    """Integer neg/abs (float forms: lower_float.py)."""
    def handler(c, instr):
        ptype, x = _typed_source(c, instr, "s")
        b = c.b
        if is_neg:
            value = b.neg(x)
        else:
            value = b.select(b.icmp_signed("<", x, ir.Constant(x.type, 0)), b.neg(x), x)
        c.write(instr.operands[0], ptype, value, instr)
    return handler


def _shift(left: bool):
    def handler(c, instr):
        ptype, x = _typed_source(c, instr, "bsu")
        amount = c.read(instr.operands[2], _U32, instr)
        b = c.b
        bits = ptype.bits
        big = b.icmp_unsigned(">=", amount, ir.Constant(I32, bits))
        safe = b.select(big, ir.Constant(I32, bits - 1), amount)
        safe = b.zext(safe, x.type) if bits > 32 else b.trunc(safe, x.type) if bits < 32 \
            else safe
        if left:
            value = b.select(big, ir.Constant(x.type, 0), b.shl(x, safe))
        elif ptype.is_signed:
            value = b.ashr(x, safe)
        else:
            value = b.select(big, ir.Constant(x.type, 0), b.lshr(x, safe))
        c.write(instr.operands[0], ptype, value, instr)
    return handler


def _selp(c: _KernelCompiler, instr) -> None:
    mods = _Mods(instr)
    ptype = mods.type()
    mods.done()
    x, y = (c.read(o, ptype, instr) for o in instr.operands[1:3])
    chosen = c.b.select(c.read(instr.operands[3], TYPES["pred"], instr), x, y)
    c.write(instr.operands[0], ptype, chosen, instr)


def _bra(c: _KernelCompiler, instr, pc: int) -> None:
    target_pc = c.program.code[pc].target_pc
    if target_pc < 0:
        raise NotCompiled(instr.text, instr.line)
    target = c.blocks[target_pc]
    if target_pc <= pc:
        target = c.loop_check(target, target_pc, pc)
    c.transfer(instr, pc, target)


def _exit(c: _KernelCompiler, instr, pc: int) -> None:
    done = c.fn.append_basic_block(f"exit{pc}")
    if instr.opcode == "ret" and c.returns is not None:
        ir.IRBuilder(done).branch(c.returns)
    else:
        c.thread_exit(ir.IRBuilder(done))
    c.transfer(instr, pc, done)


def _barrier(c: _KernelCompiler, instr, pc: int) -> None:
    mods = _Mods(instr)
    mods.take("sync")
    mods.take("aligned")
    mods.take("cta")
    mods.done()
    if len(instr.operands) not in (1, 2) or pc + 1 not in c.blocks:
        raise NotCompiled(instr.text, instr.line)
    c.barriers += 1
    wait = c.fn.append_basic_block(f"barrier{pc}")
    c.suspend(ir.IRBuilder(wait), c.barriers, c.blocks[pc + 1], c.saved_at(pc + 1))
    c.transfer(instr, pc, wait)


_HANDLERS = {
    "ld": _ld, "st": _st, "mov": _mov, "cvta": _cvta,
    "add": _arith("add"), "sub": _arith("sub"),
    "div": _div_rem(True), "rem": _div_rem(False), "min": _min_max(True),
    "max": _min_max(False), "and": _logic("and_"), "or": _logic("or_"),
    "xor": _logic("xor"), "not": _not, "neg": _neg_abs(True), "abs": _neg_abs(False),
    "shl": _shift(True), "shr": _shift(False), "selp": _selp,
    "atom": _atom, "red": _atom, "popc": _bit_count("popc"), "clz": _bit_count("clz"),
    "brev": _bit_count("brev"),
    "bra": _bra, "ret": _exit, "exit": _exit, "bar": _barrier, "barrier": _barrier,
}


# -- liveness: what a thread saves when its turn ends ---------------------------------------------

def _live_registers(program, kernel, function, end_pc: int) -> dict[int, set[int]]:
    """Registers live on entry to each pc of the kernel (backward dataflow to a fixpoint)."""
    entry = kernel.entry_pc
    body = function.body
    uses, kills, successors = {}, {}, {}
    for pc in range(entry, end_pc):
        compiled = program.code[pc]
        index = pc - entry
        uses[pc], kills[pc] = uses_and_kills(body[index]) if index < len(body) else (
            set(), set())
        conditional = compiled.guard is not None
        if compiled.kind == "bra":
            following = [compiled.target_pc] + ([pc + 1] if conditional else [])
        elif compiled.kind in ("ret", "exit"):
            following = [pc + 1] if conditional else []
        else:
            following = [pc + 1]
        successors[pc] = [s for s in following if entry <= s < end_pc]
    live = {pc: set() for pc in range(entry, end_pc)}
    changed = True
    while changed:
        changed = False
        for pc in reversed(range(entry, end_pc)):
            after = set().union(*(live[s] for s in successors[pc])) if successors[pc] else set()
            now = uses[pc] | (after - kills[pc])
            if now != live[pc]:
                live[pc] = now
                changed = True
    return live


# -- values ------------------------------------------------------------------------------------

def _constant(value, ptype: PtxType) -> ir.Constant:
    if ptype.kind == "pred":
        return ir.Constant(I1, int(bool(value)))
    bits = int(np.asarray(value).view(f"uint{ptype.bits}"))
    if ptype.name in ("f32", "f64"):
        return ir.Constant(ir.IntType(ptype.bits), bits).bitcast(ltype(ptype))
    return ir.Constant(ir.IntType(ptype.bits), bits)


def _as_int(b, value, ptype: PtxType):
    return b.bitcast(value, ir.IntType(ptype.bits)) if ptype.name in ("f32", "f64") else value


def _convert(b, value, src: PtxType, dst: PtxType):
    """The interpreter's `converter`: the bits of a `src` value as a `dst` value."""
    if ltype(src) == ltype(dst):
        return value
    if src.bits == dst.bits:
        return b.bitcast(value, ltype(dst))
    bits = _as_int(b, value, src)
    if src.bits > dst.bits:
        bits = b.trunc(bits, ir.IntType(dst.bits))
    else:
        bits = _widen(b, bits, src, dst.bits)
    return b.bitcast(bits, ltype(dst)) if dst.name in ("f32", "f64") else bits


def _to_i64(b, value, ptype: PtxType):
    bits = _as_int(b, value, ptype)
    return bits if ptype.bits == 64 else b.zext(bits, I64)


def _from_i64(b, bits, ptype: PtxType):
    value = bits if ptype.bits == 64 else b.trunc(bits, ltype(ptype) if ptype.kind == "pred"
                                                  else ir.IntType(ptype.bits))
    return b.bitcast(value, ltype(ptype)) if ptype.name in ("f32", "f64") else value


# Calls, warp instructions, barriers, branches, fences and special registers add their
# handlers (they use the helpers above).
from . import (  # noqa: E402, F401
    barriers,
    calls,
    control,
    fences,
    half_atomics,
    special_registers,
    surfaces,
    textures,
    warps,
)


def _extend_handlers() -> None:
    """Instruction families lowered in modules of their own (they import this one)."""
    from .lower_compare import compare_handlers
    from .lower_convert import convert_handlers
    from .lower_float import float_handlers
    from .lower_integer import integer_handlers
    for extend in (float_handlers, integer_handlers, convert_handlers, compare_handlers):
        _HANDLERS.update(extend(dict(_HANDLERS)))


_extend_handlers()
