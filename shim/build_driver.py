"""cffi builder of the driver shim: the extension `vgpu.shim._libcuda`, loaded as libcuda.so.1.

Used by setup.py (`cffi_modules`). The extension is a cffi *embedding* module: a C program
that loads it as libcuda.so.1 gets a Python runtime started on its first CUDA call. Its C is
the generated stubs and tables (shim/generated/, from cuda.h) plus the hand-written runtime
start, cuGetProcAddress and error texts (shim/c/). Needs only gcc, Python's headers and cffi.

The interpreter running this build is recorded in the library: a C program starts that
interpreter (its prefix and site-packages), whatever PATH says, and the shim refuses to run
inside a Python of another major.minor version.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from pathlib import Path

import cffi

__all__ = ["ffibuilder"]

SHIM_DIR = Path(__file__).resolve().parent
GENERATED = SHIM_DIR / "generated"
C_DIR = SHIM_DIR / "c"
MODULE = "vgpu.shim._libcuda"

# Runs inside the process that loaded the shim, when the C layer first starts cffi. It must
# never raise (cffi would print a traceback and answer 0, which is CUDA_SUCCESS): failures go
# back to C as text, and C prints the one line. `vgpu` normally imports from the recorded
# interpreter's environment; a foreign Python application (same version) may lack it on its
# path, so the directories it was installed into are added then.
INIT_CODE = """
import sys

_module = sys.modules[{module!r}]


@_module.ffi.def_extern(error=0)
def vgpu_py_boot(error, size):
    try:
        try:
            from vgpu.shim import dispatch
        except ImportError:
            import site
            for path in {site_dirs!r}:
                site.addsitedir(path)
            from vgpu.shim import dispatch
        dispatch.boot_driver(_module.ffi, _module.lib)
        return 1
    except BaseException as exc:
        text = f"{{type(exc).__name__}}: {{exc}}".encode("utf-8", "replace")[: size - 1]
        _module.ffi.memmove(error, text + b"\\0", len(text) + 1)
        return 0
"""

# Declarations cffi exposes to Python (`ffi`, `lib`) besides cuda.h's types.
CDEF = """
extern "Python+C" int vgpu_py_boot(char *error, size_t size);
extern "Python+C" int vgpu_py_dispatch(int fn_id, void **args, void *result);
void *vgpu_driver_entry(int fn_id);
const char *vgpu_driver_symbol_name(int fn_id);
"""

# The module's own C: cffi_start_python() is static to this file, the other C files reach
# it through this wrapper.
PREAMBLE = """
#include "driver_shim.h"

int vgpu_cffi_start(void) { return cffi_start_python(); }
"""


def _relative(path: Path) -> str:
    """setuptools wants sources relative to setup.py's directory, the build's cwd."""
    return os.path.relpath(path)


def _c_string(text: str) -> str:
    return json.dumps(text)  # a valid C string literal for any path


def _link_args() -> list[str]:
    # A C program must find the libpython the shim links, wherever this Python lives.
    return ["-Wl,-soname,libcuda.so.1",
            f"-Wl,--version-script={_relative(GENERATED / 'libcuda.map')}",
            f"-Wl,-rpath,{sysconfig.get_config_var('LIBDIR')}"]


def _site_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


ffibuilder = cffi.FFI()
ffibuilder.cdef((GENERATED / "cuda_types.h").read_text() + CDEF)
ffibuilder.embedding_init_code(INIT_CODE.format(module=MODULE, site_dirs=_site_dirs()))
ffibuilder.set_source(
    MODULE,
    PREAMBLE,
    sources=[_relative(path) for path in (
        GENERATED / "driver_stubs.c", GENERATED / "driver_tables.c",
        C_DIR / "driver_dispatch.c", C_DIR / "driver_proc_address.c",
        C_DIR / "driver_errors.c", C_DIR / "embedded_python.c")],
    include_dirs=[_relative(GENERATED), _relative(C_DIR)],
    define_macros=[("VGPU_PYTHON_EXECUTABLE", _c_string(sys.executable))],
    # Embedding: the library starts Python itself, so it links libpython (cffi adds this only
    # to its own compile(), not to setuptools builds).
    libraries=[f"python{sysconfig.get_config_var('LDVERSION')}"],
    extra_link_args=_link_args(),
    # The library is bound to this Python version (it embeds it); abi3 would be a false claim.
    py_limited_api=False,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
