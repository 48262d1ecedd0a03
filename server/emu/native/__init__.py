"""Kernels compiled to native code with LLVM (llvmlite): the emulator's fast path.

On by default; off with VGPU_EMU_COMPILE=0 in the server's environment, `vgpu server
--no-compile`, or `configure(enabled=False)`. Blocks run on `threads` native threads
(VGPU_EMU_THREADS, `--threads N`; default: the CPUs this process may use). A kernel that
uses anything the compiler does not translate yet runs on the interpreter, with one log
line per module and kernel naming the instruction (INFO: a normal event now that the
compiler is on by default; `vgpu server -v` shows it). The execution model is in the
emulator's README.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import threading
import time

__all__ = ["compiled_kernel", "configure", "enabled", "threads"]

# The largest kernel (PTX instructions) compiled: LLVM's optimizer takes minutes on the
# biggest library kernels (CUB's sorts, some thousands of instructions); they run
# interpreted, as anything else the compiler does not take.
MAX_INSTRUCTIONS = 1000
_log = logging.getLogger("vgpu.emu.native")


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # not Linux
        return os.cpu_count() or 1


_settings = {"enabled": os.environ.get("VGPU_EMU_COMPILE", "").lower() not in ("0", "off", "no"),
             "threads": max(1, int(os.environ.get("VGPU_EMU_THREADS") or _available_cpus()))}
_lock = threading.Lock()
_names = itertools.count()


def configure(enabled: bool | None = None, threads: int | None = None) -> None:
    if enabled is not None:
        _settings["enabled"] = bool(enabled)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        _settings["threads"] = threads


def enabled() -> bool:
    return _settings["enabled"]


def threads() -> int:
    return _settings["threads"]


def compiled_kernel(module, name: str):
    """The NativeKernel for kernel `name` of a PtxModule, compiled (or read from the disk
    cache) at its first launch; None when it runs on the interpreter."""
    with _lock:
        if name not in module.native_kernels:
            from .codegen import NotCompiled
            try:
                module.native_kernels[name] = _build(module, name)
            except NotCompiled as exc:
                _log.info("kernel %r runs on the interpreter: the compiler does not handle "
                             "%s", name, exc)
                module.native_kernels[name] = None
        return module.native_kernels[name]


def _build(module, name: str):
    from .codegen import NotCompiled, kernel_ir
    from .engine import cache_key, compile_object, load_cached, load_object, store_cached
    from .runner import NativeKernel
    kernel = module.program.kernels[name]
    # Device functions are inlined: their instructions count too.
    size = sum(len(module.program.module.functions[f].body) for f in kernel.functions)
    if size > MAX_INSTRUCTIONS:
        raise NotCompiled(f"a kernel of {size} instructions (up to {MAX_INSTRUCTIONS} are "
                          f"compiled)", kernel.function.line)
    key = None
    if module.source_hash is not None:
        key = cache_key(module.source_hash, name)
        cached = load_cached(key, ("function", "symbols", "sites", "spill"))
        if cached is not None:
            data, meta = cached
            return NativeKernel(load_object(data, meta["function"]), meta["symbols"],
                                meta["spill"], meta["sites"])
        function = f"vgpu_{key}"
    else:
        function = f"vgpu_anonymous_{next(_names)}"
    start = time.perf_counter()
    text, symbols, sites, spill = kernel_ir(module.program, kernel, function)
    data = compile_object(text)
    _log.info("kernel %r (%d instructions) compiled in %.0f ms", name, size,
              (time.perf_counter() - start) * 1e3)
    if key is not None:
        store_cached(key, data, {"function": function, "symbols": symbols, "sites": sites,
                                 "spill": spill})
    return NativeKernel(load_object(data, function), symbols, spill, sites)


def source_hash(*texts: str) -> str:
    """What identifies a module's PTX in the disk cache's key."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode() + b"\0")
    return digest.hexdigest()
