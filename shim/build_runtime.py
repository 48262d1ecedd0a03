"""cffi builder of the runtime shim: the extension `vgpu.shim._libcudart`, loaded as
libcudart.so.13 by programs built with `nvcc -cudart shared`.

Used by setup.py (`cffi_modules`); see shim_builder.py for what all shims share. Every symbol
is exported under the version `libcudart.so.13`, as NVIDIA's library exports it: that is the
version such programs import.
"""

import runpy
from pathlib import Path

__all__ = ["ffibuilder"]

_make_ffibuilder = runpy.run_path(str(Path(__file__).with_name("shim_builder.py")))[
    "make_ffibuilder"]

ffibuilder = _make_ffibuilder(
    library="libcudart",
    soname="libcudart.so.13",
    prefix="runtime",
    types_header="cudart_types.h",
    sources=["generated/runtime_stubs.c", "generated/runtime_tables.c",
             "c/runtime_dispatch.c", "c/runtime_launch_config.c"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
