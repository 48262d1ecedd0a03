"""What the shims' cffi builders share (build_driver.py, build_runtime.py load this file).

Each shim is a cffi *embedding* module: a program that loads it as its CUDA library gets a
Python runtime started on its first call. Its C is generated stubs and tables (from NVIDIA's
headers, shim/generated/) plus hand-written C (shim/c/): the runtime start, the gate the stubs
pass. Each stub calls its own typed cffi callback (`<prefix>_callbacks.h`, declared here
`extern "Python+C"`), so cffi's generated C converts the arguments. Building needs only gcc,
Python's headers and cffi.

What one committed file already says is rendered here rather than committed again: the
exported functions' prototypes (`<prefix>_functions.h`, from the API table in
vgpu/api/generated/) and cffi's form of the types.

The interpreter running the build is recorded in the library: a C program starts that
interpreter (its prefix and site-packages), whatever PATH says, and the shim refuses to run
inside a Python of another major.minor version.
"""

import json
import os
import re
import runpy
import sys
import sysconfig
from pathlib import Path

import cffi

SHIM_DIR = Path(__file__).resolve().parent
GENERATED = SHIM_DIR / "generated"
C_DIR = SHIM_DIR / "c"
API_TABLES = SHIM_DIR.parent / "vgpu" / "api" / "generated"
RENDERED = SHIM_DIR.parent / "build" / "rendered"  # what the build renders; git ignores build/

# The generator writes an over-aligned struct's alignment after its closing brace
# (`} __attribute__((aligned(8)));`). cffi reads no attributes: its cdef ends such a struct in
# `...;` instead, and cffi then takes the layout from the compiler.
_ALIGNED_END = re.compile(r"^\} __attribute__\(\(aligned\(.+\)\)\)", re.MULTILINE)

# Runs inside the process that loaded the shim, when the C layer first starts cffi. It must
# never raise (cffi would print a traceback and answer 0, which is CUDA_SUCCESS): failures go
# back to C as text, and C prints the one line. `vgpu` normally imports from the recorded
# interpreter's environment; a foreign Python application (same version) may lack it on its
# path, so the directories it was installed into are added then.
INIT_CODE = """
import sys

_module = sys.modules[{module!r}]


@_module.ffi.def_extern(error=0)
def vgpu_boot(error, size):
    try:
        try:
            from vgpu.shim import dispatch
        except ImportError:
            import site
            for path in {site_dirs!r}:
                site.addsitedir(path)
            from vgpu.shim import dispatch
        dispatch.{boot}(_module.ffi, _module.lib)
        return 1
    except BaseException as exc:
        text = f"{{type(exc).__name__}}: {{exc}}".encode("utf-8", "replace")[: size - 1]
        _module.ffi.memmove(error, text + b"\\0", len(text) + 1)
        return 0
"""

# Declarations cffi exposes to Python (`ffi`, `lib`) besides the API's types and callbacks.
CDEF = """
extern "Python+C" int vgpu_boot(char *error, size_t size);
void *vgpu_{prefix}_entry(int fn_id);
const char *vgpu_{prefix}_symbol_name(int fn_id);
void vgpu_note_interruption(void);
"""

# The module's own C: cffi_start_python() is static to this file, the other C files reach
# it through this wrapper.
PREAMBLE = """
#include "{prefix}_shim.h"

int vgpu_cffi_start(void) {{ return cffi_start_python(); }}
"""


def _relative(path: Path) -> str:
    """setuptools wants sources relative to setup.py's directory, the build's cwd."""
    return os.path.relpath(path)


def _site_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def _declare(ctype: str, name: str) -> str:
    """A declaration of `name` with a type written as in a cast (`void **` -> `void **name`)."""
    return f"{ctype}{name}" if ctype.endswith("*") else f"{ctype} {name}"


def _render_prototypes(prefix: str) -> None:
    """Writes RENDERED/<prefix>_functions.h, which the shim's C includes: every exported
    function's prototype, from the rows of the API table (as the generator read them from
    NVIDIA's declarations)."""
    table = API_TABLES / f"{prefix}_table.py"
    lines = [f"/* Generated from {table.relative_to(SHIM_DIR.parent)} by shim/shim_builder.py "
             "at every build of the shims (pip install -e .): do not edit. */"]
    for symbol, _, restype, params in runpy.run_path(str(table))["FUNCTIONS"]:
        args = ", ".join(_declare(ctype, name) for ctype, name, _ in params) or "void"
        lines.append(_declare(restype, f"{symbol}({args})") + ";")
    RENDERED.mkdir(parents=True, exist_ok=True)
    (RENDERED / f"{prefix}_functions.h").write_text("\n".join(lines) + "\n")


def _cdef_types(types_header: str) -> str:
    """cffi's form of the window-system types and the shim's own (in shim/generated/)."""
    text = "".join((GENERATED / name).read_text() for name in ("foreign_types.h", types_header))
    return _ALIGNED_END.sub("  ...;\n}", text)


def make_ffibuilder(*, library: str, soname: str, prefix: str, types_header: str,
                    sources: list[str], cdef: str = "") -> cffi.FFI:
    """The builder of `vgpu.shim._<library>`: `prefix` names its C (`driver_shim.h`,
    `driver_callbacks.h`), `types_header` its types (in shim/generated/), `sources` its C
    files besides the common ones, `cdef` what else of its C Python calls."""
    module = f"vgpu.shim._{library}"
    builder = cffi.FFI()
    callbacks = (GENERATED / f"{prefix}_callbacks.h").read_text()
    builder.cdef(_cdef_types(types_header) + CDEF.format(prefix=prefix) + cdef
                 + f'extern "Python+C" {{\n{callbacks}}}\n')
    _render_prototypes(prefix)
    builder.embedding_init_code(INIT_CODE.format(module=module, site_dirs=_site_dirs(),
                                                 boot=f"boot_{prefix}"))
    builder.set_source(
        module,
        PREAMBLE.format(prefix=prefix),
        sources=[_relative(SHIM_DIR / source) for source in [*sources, "c/embedded_python.c"]],
        include_dirs=[_relative(GENERATED), _relative(RENDERED), _relative(C_DIR)],
        define_macros=[("VGPU_PYTHON_EXECUTABLE", json.dumps(sys.executable))],
        # Over 2 MB of generated glue (stubs, cffi's callbacks): -O1 (after Python's -O3)
        # builds it a third faster; a call through it measured within 5 ns of -O3's.
        extra_compile_args=["-O1"],
        # Embedding: the library starts Python itself, so it links libpython (cffi adds this
        # only to its own compile(), not to setuptools builds), and finds it wherever this
        # Python lives.
        libraries=[f"python{sysconfig.get_config_var('LDVERSION')}"],
        extra_link_args=[f"-Wl,-soname,{soname}",
                         f"-Wl,--version-script={_relative(GENERATED / f'{library}.map')}",
                         f"-Wl,-rpath,{sysconfig.get_config_var('LIBDIR')}"],
        # Bound to this Python version (it embeds it): abi3 would be a false claim.
        py_limited_api=False,
    )
    return builder
