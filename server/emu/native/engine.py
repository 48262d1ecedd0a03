"""LLVM: IR text -> optimized native object -> a function address in this process, with the
objects kept on disk so that a program's second run compiles nothing.

One MCJIT engine per process holds every loaded object; compiling and loading take a lock
(LLVM's context is not thread-safe), running the functions does not. The disk cache lives in
$VGPU_CACHE_DIR/native (default ~/.cache/vgpu/native): `<key>.o` is the object and
`<key>.json` what the runner needs besides it; the key (see `cache_key`) covers the PTX, the
kernel, the emulator's source, LLVM's version and the host CPU, so a stale entry is never
used. Every kernel a server runs is compiled, so the folder is kept under CACHE_LIMIT
bytes: storing an entry that takes it over removes the least recently used entries (a read
marks an entry used) down to three quarters of the limit.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

__all__ = ["CACHE_LIMIT", "cache_key", "compile_object", "load_cached", "load_functions",
           "load_object", "source_digest", "store_cached", "target_triple"]

CACHE_LIMIT = 256 << 20

_lock = threading.Lock()
_state: dict = {}
_loaded: dict[str, int] = {}   # function name -> address


def _machine():
    if not _state:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        target = llvm.Target.from_default_triple()
        features = llvm.get_host_cpu_features().flatten()
        machine = target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                               features=features, opt=3)
        _state["machine"] = machine
        _state["engine"] = llvm.create_mcjit_compiler(llvm.parse_assembly(""), machine)
        _state["host"] = f"{llvm.get_host_cpu_name()} {features}"
    return _state["machine"]


def cache_key(*parts: str) -> str:
    """The disk cache's key for a kernel: its parts plus the compiler's whole context: the
    emulator's source (the generated code follows from it: any change there makes new
    keys, with no version to remember to bump), llvmlite's version and the host CPU."""
    _machine()
    digest = hashlib.sha256()
    for part in (*parts, source_digest(_EMULATOR), llvmlite.__version__, _state["host"]):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:40]


_EMULATOR = Path(__file__).resolve().parents[1]   # server/emu (vgpu/server/emu installed)


@functools.cache
def source_digest(directory: Path) -> str:
    """A digest of the Python source under `directory`: its files' names and contents
    (some 70 files, 1.6 ms)."""
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*.py")):
        digest.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def compile_object(text: str) -> bytes:
    """Optimize the IR module `text` for this CPU and return it as an object file."""
    with _lock:
        machine = _machine()
        module = llvm.parse_assembly(text)
        module.triple = machine.triple
        module.data_layout = str(machine.target_data)
        module.verify()
        options = llvm.create_pipeline_tuning_options(speed_level=3)
        builder = llvm.create_pass_builder(machine, options)
        builder.getModulePassManager().run(module, builder)
        return machine.emit_object(module)


def load_object(data: bytes, name: str) -> int:
    """Load an object into the process (once per function name); the address of `name`."""
    return load_functions(data, (name,))[name]


def load_functions(data: bytes, names) -> dict[str, int]:
    """Load an object that defines `names` into the process (once); their addresses."""
    with _lock:
        if any(name not in _loaded for name in names):
            _machine()
            engine = _state["engine"]
            engine.add_object_file(llvm.ObjectFileRef.from_data(data))
            engine.finalize_object()
            for name in names:
                address = engine.get_function_address(name)
                if not address:
                    raise RuntimeError(f"compiled object does not define {name}")
                _loaded[name] = address
        return {name: _loaded[name] for name in names}


def target_triple() -> str:
    """The triple code is compiled for (this host's)."""
    with _lock:
        return _machine().triple


def _directory() -> Path:
    root = os.environ.get("VGPU_CACHE_DIR") or os.path.join(Path.home(), ".cache", "vgpu")
    return Path(root) / "native"


def load_cached(key: str, fields: tuple[str, ...]) -> tuple[bytes, dict] | None:
    """The object and description stored under `key`, if both are there and the description
    has `fields`."""
    directory = _directory()
    try:
        description = directory / f"{key}.json"
        meta = json.loads(description.read_text())
        if not isinstance(meta, dict) or not all(f in meta for f in fields):
            return None
        data = (directory / f"{key}.o").read_bytes()
        os.utime(description)   # used now: the last to be removed
        return data, meta
    except (OSError, ValueError):
        return None


def store_cached(key: str, data: bytes, meta: dict) -> None:
    """Write the entry (object first, then its description, each atomically): a reader
    never sees a description without its object. A cache that cannot be written is skipped."""
    directory = _directory()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for suffix, payload in ((".o", data), (".json", json.dumps(meta).encode())):
            handle, temporary = tempfile.mkstemp(dir=directory)
            with os.fdopen(handle, "wb") as file:
                file.write(payload)
            os.replace(temporary, directory / f"{key}{suffix}")
        _trim(directory)
    except OSError:
        pass


def _trim(directory: Path) -> None:
    """Remove the least recently used entries while the folder holds over CACHE_LIMIT."""
    entries: dict[str, list] = {}   # key -> [last use, bytes]
    total = 0
    for item in os.scandir(directory):
        stem, suffix = os.path.splitext(item.name)
        if suffix not in (".o", ".json"):
            continue
        status = item.stat()
        entry = entries.setdefault(stem, [0.0, 0])
        entry[1] += status.st_size
        if suffix == ".json":
            entry[0] = status.st_mtime
        total += status.st_size
    if total <= CACHE_LIMIT:
        return
    for stem, (_, size) in sorted(entries.items(), key=lambda e: e[1][0]):
        for suffix in (".json", ".o"):   # the description first: no entry without object
            try:
                os.unlink(directory / f"{stem}{suffix}")
            except FileNotFoundError:
                pass
        total -= size
        if total <= CACHE_LIMIT * 3 // 4:
            return
