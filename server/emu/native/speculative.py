"""Speculative blocks: a block's threads run first with the checks that cannot fail cheaply
left out, so that LLVM can vectorize the thread loop over lanes; the threads the fast pass
could not vouch for then run again, checked as usual.

The fast pass is a second compilation of the kernel's per-thread code (the "speculative"
variant) in which
  - a global access compares its address only with the allocation its site's cache holds
    (filled by the checked runs; read-only here), the alignment and window checks stay; an
    access that does not pass ends the thread with MISSED instead of looking further or
    faulting. An address that steps evenly with tid.x is checked once for the whole row
    of lanes, its first and last address (row_checks.py);
  - stores go to a stack slot per store site and are copied to memory when the thread
    exits, so a thread that missed has written nothing.
Threads that missed are then run whole by the checked code, in thread order, which looks
allocations up (filling the caches), reports strays and faults word for word.

Only kernels whose threads cannot tell the difference get the fast pass: no barriers, no
backward branches (so a thread runs once, each store site at most once, and every thread
ends), no calls, nothing but weak loads, stores and register arithmetic (`SAFE_OPCODES`),
and no load after a store in program order (deferred stores are not seen by later loads of
the same thread). Threads that missed run after the rest of their block instead of in their turn;
threads of a block that communicate without a barrier race, so CUDA promises no order.

Runs of blocks: where 1D blocks have no shared or local memory and the kernel reads %tid.x
and %ctaid.x only as blockIdx.x * blockDim.x + threadIdx.x (`joins_blocks`), up to
RUN_LANES lanes of consecutive blocks run as one row: lane j of a run starting at block c
computes c * blockDim.x + j, the index of thread j % blockDim.x of block c + j / blockDim.x,
and nothing else in it can tell. The row's checks, its guards and the loop's entry are
then paid once for the run (a 256-thread saxpy block spent as long on them as on its
lanes); a lane that misses reruns as its own block's thread.
"""

from __future__ import annotations

import re

from llvmlite import ir

from ..executor import MAX_THREADS_PER_BLOCK
from ..ir import RegisterOperand, SpecialRegister
from .registers import destinations, uses_and_kills

__all__ = ["MISSED", "RUN_LANES", "SAFE_OPCODES", "eligible", "joins_blocks", "loop_metadata",
           "speculative_block", "vectorize_hint"]

MISSED = 1   # what the speculative thread returns when a check did not pass
# The most lanes a run of blocks puts in one row: a block's most threads, which a row's
# checks assume (row_checks.py).
RUN_LANES = MAX_THREADS_PER_BLOCK

# Instructions with no effect besides their destination registers (and ld/st): the fast
# pass may run them for a thread that is run again.
SAFE_OPCODES = frozenset({
    "ld", "st", "mov", "cvta", "add", "sub", "mul", "mad", "fma", "div", "rem", "min", "max",
    "and", "or", "xor", "not", "neg", "abs", "shl", "shr", "setp", "selp", "cvt", "sqrt",
    "rcp", "popc", "clz", "brev", "bra", "ret", "exit"})

# Accesses other threads may be watching (flags, locks): they keep their turn in the order.
_ORDERED = frozenset({"volatile", "relaxed", "acquire", "release", "acq_rel", "sc", "mmio"})

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)


def eligible(program, kernel, function, end_pc: int) -> bool:
    """Whether the kernel's threads may run speculatively (see the module's comment)."""
    entry = kernel.entry_pc
    body = function.body
    last_load, first_store = -1, end_pc
    for pc in range(entry, min(end_pc, entry + len(body))):
        instr = body[pc - entry]
        if instr.opcode not in SAFE_OPCODES or _ORDERED & set(instr.modifiers):
            return False
        if instr.opcode == "bra" and program.code[pc].target_pc <= pc:
            return False
        if instr.opcode == "ld":
            last_load = pc
        elif instr.opcode == "st":
            first_store = min(first_store, pc)
    return last_load < first_store


def joins_blocks(body) -> bool:
    """Whether the fast pass may run consecutive 1D blocks as one row of lanes, each lane
    with the first block's ctaid.x and a tid.x counting on across the blocks: true when
    the kernel reads %tid.x and %ctaid.x only to compute ctaid.x * ntid.x + tid.x (one
    mad.lo, or a mul.lo and an add, on registers nothing else reads), which such a lane
    computes as its own thread does, and nothing else tells the threads of a block apart
    (%laneid, %warpid, the lane masks, %clusterid). Shared and local memory are per block
    and per thread: the block loop leaves kernels that have them to one block at a time."""
    movs: dict[str, list] = {}          # %tid.x, %ctaid.x -> the instructions reading them
    writers: dict[int, list] = {}       # register id -> the instructions writing it
    readers: dict[int, list] = {}       # register id -> the instructions reading it
    for instr in body:
        for op in destinations(instr):
            writers.setdefault(op.reg.id, []).append(instr)
        for register in uses_and_kills(instr)[0]:
            readers.setdefault(register, []).append(instr)
        for op in instr.operands:
            if not isinstance(op, SpecialRegister):
                continue
            if op.name in ("%laneid", "%warpid") or op.name.startswith(
                    ("%lanemask", "%clusterid")):
                return False
            if op.name in ("%tid.x", "%ctaid.x"):
                movs.setdefault(op.name, []).append(instr)
    if not movs:
        return True
    if sorted(movs) != ["%ctaid.x", "%tid.x"] or any(
            len(found) != 1 or found[0].opcode != "mov" or found[0].guard is not None
            or not _index_type(found[0]) for found in movs.values()):
        return False

    def only_reader(register: int):
        """The one unguarded 32-bit instruction reading `register` (written once)."""
        found = readers.get(register, [])
        if len(writers.get(register, [])) != 1 or len(found) != 1:
            return None
        return found[0] if found[0].guard is None and _index_type(found[0]) else None

    def ntid(register) -> bool:   # written, and every write of it reads %ntid.x
        found = writers.get(register, [])
        return bool(found) and all(
            w.opcode == "mov" and isinstance(w.operands[1], SpecialRegister)
            and w.operands[1].name == "%ntid.x" for w in found)

    def sources(instr) -> list:
        return [op.reg.id if isinstance(op, RegisterOperand) and not op.negate else None
                for op in instr.operands[1:]]

    def scales(instr, ctaid: int) -> bool:   # ctaid * ntid (either way round), low half
        a, b = sources(instr)[:2]
        other = b if a == ctaid else a if b == ctaid else None
        return "lo" in instr.modifiers and other is not None and ntid(other)

    tid, ctaid = (movs[name][0].operands[0].reg.id for name in ("%tid.x", "%ctaid.x"))
    combine, scale = only_reader(tid), only_reader(ctaid)
    if combine is None or scale is None:
        return False
    if combine is scale:   # mad.lo d, ctaid, ntid, tid
        return combine.opcode == "mad" and scales(combine, ctaid) \
            and sources(combine)[2] == tid
    # mul.lo p, ctaid, ntid; add d, p, tid
    product = scale.operands[0].reg.id
    return scale.opcode == "mul" and scales(scale, ctaid) and combine.opcode == "add" \
        and only_reader(product) is combine and sources(combine) in ([product, tid],
                                                                      [tid, product])


def _index_type(instr) -> bool:
    return bool({"s32", "u32", "b32"} & set(instr.modifiers))


class Deferred:
    """The store sites of the speculative thread: where each writes and what, until exit."""

    def __init__(self, entry: ir.IRBuilder):
        self.entry = entry            # allocas and their initial values go here
        self.sites: list[tuple] = []  # (buffer, destination slot, done flag, size)

    def pointer(self, b: ir.IRBuilder, real, size: int):
        """Where a store of `size` bytes to `real` (an i8*) writes now."""
        buffer = self.entry.alloca(ir.ArrayType(ir.IntType(8), size))
        destination = self.entry.alloca(real.type)
        done = self.entry.alloca(I1)
        self.entry.store(ir.Constant(I1, 0), done)
        b.store(real, destination)
        b.store(ir.Constant(I1, 1), done)
        self.sites.append((buffer, destination, done, size))
        return b.bitcast(buffer, real.type)

    def commit(self, fn: ir.Function, b: ir.IRBuilder, memcpy) -> None:
        """At the thread's exit: the stores it made, in program order (the sites' order:
        branches only go forward)."""
        for k, (buffer, destination, done, size) in enumerate(self.sites):
            store = fn.append_basic_block(f"commit{k}")
            after = fn.append_basic_block(f"committed{k}")
            b.cbranch(b.load(done), store, after)
            b.position_at_end(store)
            b.call(memcpy, [b.load(destination), b.bitcast(buffer, destination.type.pointee),
                            ir.Constant(I64, size), ir.Constant(I1, 0)])
            b.branch(after)
            b.position_at_end(after)
        b.ret(ir.Constant(I32, 0))


_SELF = "vgpu.loop.self"   # stands for the loop ID node itself until `loop_metadata`
_GROUP = "vgpu.access.group"   # stands for an empty distinct node (an access group)


def vectorize_hint(module: ir.Module):
    """(the lane loop's ID, the access group of its memory accesses). The ID says:
    vectorize it (LLVM's cost model turns down the fast pass's loops: it prices the 32-bit
    index arithmetic of PTX per lane, though the accesses are consecutive loads and stores,
    several times faster vectorized), and its accesses carry no dependence from one lane
    to another: threads without a barrier between them are unordered in CUDA (lanes whose
    accesses overlap race; thread order, which LLVM would otherwise keep for them, is no
    more the interpreter's, an instruction at a time over the block, than vector order
    is). Without it LLVM versions each row on whether its arrays overlap."""
    group = module.add_metadata([ir.MetaDataString(module, _GROUP)])
    hints = [module.add_metadata([ir.MetaDataString(module, name), *value]) for name, value in (
        ("llvm.loop.vectorize.enable", [ir.Constant(I1, 1)]),
        ("llvm.loop.interleave.count", [ir.Constant(I32, 1)]),
        ("llvm.loop.unroll.disable", []),
        ("llvm.loop.parallel_accesses", [group]))]
    return module.add_metadata([ir.MetaDataString(module, _SELF), *hints]), group


def loop_metadata(text: str) -> str:
    """LLVM wants a loop ID to be a distinct node whose first operand is itself, and an
    access group an empty distinct node, which llvmlite cannot build: rewrite the
    placeholders in the module's text."""
    text = re.sub(r'^(!\d+) = !\{\s*!"' + re.escape(_SELF) + '"',
                  lambda m: f"{m.group(1)} = distinct !{{{m.group(1)}", text, flags=re.M)
    return re.sub(r'^(!\d+) = !\{\s*!"' + re.escape(_GROUP) + r'"\s*\}',
                  lambda m: f"{m.group(1)} = distinct !{{}}", text, flags=re.M)


def speculative_block(fn: ir.Function, b: ir.IRBuilder, spec, thread, args: dict,
                      finished: ir.Block) -> None:
    """A block's threads (or a run's: args["blocks"] blocks along x, 1D, as `joins_blocks`
    allows): the fast pass in nested loops over z, y, x (x innermost, so that LLVM sees
    the lanes of a row as one vectorizable loop), marking in resume[t] each thread that
    missed; then the checked run of every thread that missed, in order. Branches to
    `finished` when the blocks are done; a checked run's failure (a fault, a stop) returns
    it from the block loop."""
    L, shared, local, spill, resume, fault, cache = (args[k] for k in (
        "L", "shared", "local", "spill", "resume", "fault", "cache"))
    bx, by, bz, ctaid = args["bx"], args["by"], args["bz"], args["ctaid"]
    row_lanes = b.mul(bx, args["blocks"])   # a run's blocks are one row
    local_stride, nregs = args["local_stride"], args["nregs"]
    site_cache = args["site_cache"]
    zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)
    entry = ir.IRBuilder(fn.entry_basic_block)
    entry.position_at_start(fn.entry_basic_block)

    def counted(b, count, body, name, loop_id=None):
        """for (i = 0; i < count; ++i) body(b, i); count >= 1."""
        before = b.block
        loop = fn.append_basic_block(name)
        b.branch(loop)
        b.position_at_end(loop)
        i = b.phi(I64)
        i.add_incoming(zero, before)
        body(b, i)
        nxt = b.add(i, one)
        i.add_incoming(nxt, b.block)
        done = fn.append_basic_block(name + "_done")
        back = b.cbranch(b.icmp_unsigned("<", nxt, count), loop, done)
        if loop_id is not None:
            back.set_metadata("llvm.loop", loop_id)
        b.position_at_end(done)

    def rows(b, lane, name, loop_id=None):
        """lane(b, t, tx, ty, tz) for every lane of the rows, in thread order (in a run, t
        and tx count on across its blocks)."""
        def row(b, tz, ty):
            start = b.mul(b.add(b.mul(tz, by), ty), bx)
            counted(b, row_lanes, lambda b, tx: lane(b, b.add(start, tx), tx, ty, tz), name,
                    loop_id)
        counted(b, bz, lambda b, tz: counted(b, by, lambda b, ty: row(b, tz, ty),
                                             name + "_row"), name + "_plane")

    def call(b, function, t, tx, ty, tz, block_ctaid=ctaid):
        return b.call(function, [L, shared, b.gep(local, [b.mul(t, local_stride)]),
                                 b.gep(spill, [b.mul(t, nregs)]), t,
                                 tx, *(b.trunc(v, I32) for v in (ty, tz)), *block_ctaid,
                                 ir.Constant(I32, 0), fault, cache, site_cache, row_lanes])

    # Marks are ORed in, not stored: in the lanes that pass (most) LLVM then drops the store
    # (a store of zero per lane becomes a memset call per row, a fifth of a 256-thread
    # saxpy block's time), and the loop stays free of branches (a conditional store keeps
    # the rows whose check fails from vectorizing). The marks are clear between calls (the
    # worker's buffer starts zeroed): the checked run clears each mark it reads, and a
    # checked run that fails clears them all before the call returns.
    loop_id, group = args["vectorize"]

    def fast(b, t, tx, ty, tz):
        result = call(b, spec, t, tx, ty, tz)   # inlined: its accesses join the group
        mark = b.gep(resume, [t])
        marked = b.load(mark)
        stored = b.store(b.or_(marked, result), mark)
        for instruction in (result, marked, stored):
            instruction.set_metadata("llvm.access.group", group)
        b.store(b.or_(b.load(missed), result), missed)

    missed = entry.alloca(I32)   # whether any thread missed (an OR over the lanes)
    some = fn.append_basic_block("some_missed")
    b.store(ir.Constant(I32, 0), missed)
    rows(b, fast, "lane", loop_id)
    b.cbranch(b.icmp_unsigned("!=", b.load(missed), ir.Constant(I32, 0)), some, finished)
    b.position_at_end(some)

    # The threads that missed, checked, in thread order (which fills the sites' caches), as
    # who they are: in a run, lane tx is thread tx % blockDim.x of block tx / blockDim.x.
    def recheck(b, t, tx, ty, tz):
        mark = b.gep(resume, [t])
        again = b.icmp_unsigned("!=", b.load(mark), ir.Constant(I32, 0))
        b.store(ir.Constant(I32, 0), mark)
        run = fn.append_basic_block("recheck")
        after = fn.append_basic_block("rechecked")
        b.cbranch(again, run, after)
        b.position_at_end(run)
        later = b.udiv(tx, bx)   # blocks after the run's first
        own_tx = b.urem(tx, bx)
        own_t = b.sub(t, b.sub(tx, own_tx))
        b.store(b.add(args["block"], later), b.gep(fault, [ir.Constant(I64, 5)]))
        b.store(own_t, b.gep(fault, [ir.Constant(I64, 6)]))
        result = call(b, thread, own_t, own_tx, ty, tz,
                      (b.add(ctaid[0], b.trunc(later, I32)), *ctaid[1:]))
        failed = fn.append_basic_block("recheck_failed")
        b.cbranch(b.icmp_signed("<", result, ir.Constant(I32, 0)), failed, after)
        leave = ir.IRBuilder(failed)
        args["clear_marks"](leave)   # the later lanes' marks
        leave.ret(result)
        b.position_at_end(after)

    rows(b, recheck, "missed")
    b.branch(finished)
