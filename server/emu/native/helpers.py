"""The helpers every compiled kernel links in, as LLVM IR text (opaque pointers).

`vgpu_lookup` is the slow path of a global access (the fast path, inline in the kernel,
compares the address with the allocation the worker's last access found): a binary search of
the allocation table, the access rights, the mapped-granule (stray) policy, and the fault
record when the access is illegal. `vgpu_fault` fills the fault record for the inline
checks (alignment, shared, local and parameter bounds). Slot numbers: see codegen.py.
"""

__all__ = ["HELPERS_IR"]

HELPERS_IR = r"""
define internal void @vgpu_fault(ptr %fault, i64 %code, i64 %addr, i64 %size, i64 %need,
                                 i64 %line, i64 %space, i64 %why) noinline cold {
  store i64 %code, ptr %fault
  %p1 = getelementptr i64, ptr %fault, i64 1
  store i64 %addr, ptr %p1
  %p2 = getelementptr i64, ptr %fault, i64 2
  store i64 %size, ptr %p2
  %p3 = getelementptr i64, ptr %fault, i64 3
  store i64 %need, ptr %p3
  %p4 = getelementptr i64, ptr %fault, i64 4
  store i64 %line, ptr %p4
  %p7 = getelementptr i64, ptr %fault, i64 7
  store i64 %space, ptr %p7
  %p8 = getelementptr i64, ptr %fault, i64 8
  store i64 %why, ptr %p8
  ret void
}

define internal ptr @vgpu_lookup(ptr %L, i64 %addr, i64 %asz, i64 %need, ptr %cache,
                                 ptr %fault, i64 %line, i64 %space) noinline {
entry:
  %tabp = getelementptr i64, ptr %L, i64 8
  %tabi = load i64, ptr %tabp
  %tab = inttoptr i64 %tabi to ptr
  %np = getelementptr i64, ptr %L, i64 9
  %n = load i64, ptr %np
  br label %loop
loop:
  %lo = phi i64 [0, %entry], [%lo2, %body]
  %hi = phi i64 [%n, %entry], [%hi2, %body]
  %more = icmp ult i64 %lo, %hi
  br i1 %more, label %body, label %searched
body:
  %sum = add i64 %lo, %hi
  %mid = lshr i64 %sum, 1
  %mo = mul i64 %mid, 5
  %bp = getelementptr i64, ptr %tab, i64 %mo
  %b = load i64, ptr %bp
  %le = icmp ule i64 %b, %addr
  %mid1 = add i64 %mid, 1
  %lo2 = select i1 %le, i64 %mid1, i64 %lo
  %hi2 = select i1 %le, i64 %hi, i64 %mid
  br label %loop
searched:
  %none = icmp eq i64 %lo, 0
  br i1 %none, label %oob, label %check
check:
  %idx = sub i64 %lo, 1
  %ro = mul i64 %idx, 5
  %rp = getelementptr i64, ptr %tab, i64 %ro
  %base = load i64, ptr %rp
  %szp = getelementptr i64, ptr %rp, i64 1
  %size = load i64, ptr %szp
  %spp = getelementptr i64, ptr %rp, i64 2
  %span = load i64, ptr %spp
  %hp = getelementptr i64, ptr %rp, i64 3
  %hosti = load i64, ptr %hp
  %host = inttoptr i64 %hosti to ptr
  %ap = getelementptr i64, ptr %rp, i64 4
  %acc = load i64, ptr %ap
  %off = sub i64 %addr, %base
  %pointer = getelementptr i8, ptr %host, i64 %off
  %m = and i64 %acc, %need
  %allowed = icmp eq i64 %m, %need
  %in1 = icmp ult i64 %off, %size
  %rem = sub i64 %size, %off
  %in2 = icmp uge i64 %rem, %asz
  %in = and i1 %in1, %in2
  br i1 %in, label %inside, label %outside
inside:
  br i1 %allowed, label %hit, label %denied
hit:
  store i64 %base, ptr %cache
  %c1 = getelementptr i64, ptr %cache, i64 1
  store i64 %size, ptr %c1
  %c2 = getelementptr i64, ptr %cache, i64 2
  store i64 %hosti, ptr %c2
  ret ptr %pointer
outside:
  %s1 = icmp ult i64 %off, %span
  %srem = sub i64 %span, %off
  %s2 = icmp uge i64 %srem, %asz
  %s = and i1 %s1, %s2
  %modep = getelementptr i64, ptr %L, i64 11
  %mode = load i64, ptr %modep
  %strict = icmp eq i64 %mode, 0
  %nots = xor i1 %s, true
  %fails = or i1 %strict, %nots
  br i1 %fails, label %oob, label %stray
stray:
  br i1 %allowed, label %strayok, label %denied
strayok:
  %report = icmp eq i64 %mode, 1
  br i1 %report, label %claim, label %done
claim:
  %flagp = getelementptr i64, ptr %L, i64 12
  %old = cmpxchg ptr %flagp, i64 0, i64 1 seq_cst seq_cst
  %won = extractvalue { i64, i1 } %old, 1
  br i1 %won, label %note, label %done
note:
  %r13 = getelementptr i64, ptr %L, i64 13
  store i64 %addr, ptr %r13
  %r14 = getelementptr i64, ptr %L, i64 14
  store i64 %asz, ptr %r14
  %r15 = getelementptr i64, ptr %L, i64 15
  store i64 %need, ptr %r15
  %r16 = getelementptr i64, ptr %L, i64 16
  store i64 %line, ptr %r16
  %r17 = getelementptr i64, ptr %L, i64 17
  store i64 %space, ptr %r17
  %f5 = getelementptr i64, ptr %fault, i64 5
  %blk = load i64, ptr %f5
  %r18 = getelementptr i64, ptr %L, i64 18
  store i64 %blk, ptr %r18
  %f6 = getelementptr i64, ptr %fault, i64 6
  %thr = load i64, ptr %f6
  %r19 = getelementptr i64, ptr %L, i64 19
  store i64 %thr, ptr %r19
  br label %done
done:
  ret ptr %pointer
oob:
  call void @vgpu_fault(ptr %fault, i64 700, i64 %addr, i64 %asz, i64 %need, i64 %line,
                        i64 %space, i64 0)
  ret ptr null
denied:
  call void @vgpu_fault(ptr %fault, i64 700, i64 %addr, i64 %asz, i64 %need, i64 %line,
                        i64 %space, i64 2)
  %f9 = getelementptr i64, ptr %fault, i64 9
  store i64 %acc, ptr %f9
  ret ptr null
}
"""
