"""Builds the shims' C extensions and lists the packages; the rest of the metadata is in
pyproject.toml."""

import sys

# pip reads `requires-python` only after this file has produced the metadata, and then, on a
# Python that does not satisfy it, it backtracks through every version of every dependency
# before giving up (a quarter of an hour for the test extra). Refuse here, in a second.
if sys.version_info < (3, 11):  # noqa: UP036  (this file runs before requires-python is read)
    sys.exit(f"vgpu needs Python 3.11 or newer; this is Python {sys.version.split()[0]} "
             f"({sys.executable}). Create the virtual environment with python3.11 or newer.")

from setuptools import Extension, find_packages, setup  # noqa: E402  (after the version check)

# Import name -> source folder. Every package below a folder is found, so a new subpackage
# cannot be left out of a wheel.
PACKAGE_DIRS = {"vgpu": "vgpu", "vgpu.shim": "shim", "vgpu.server": "server",
                "vgpu.replay": "replay"}


def _packages() -> list[str]:
    found = []
    for name, folder in PACKAGE_DIRS.items():
        found.append(name)
        found.extend(f"{name}.{sub}" for sub in find_packages(where=folder))
    return found


# vgpu's libnvrtc.so.13 (shim/c/nvrtc_forwarder.c) is plain C that never starts Python: it is
# built as an "extension" only so that setuptools compiles and installs it beside the shims,
# where shim/loader.py finds it. Nothing imports it.
NVRTC_FORWARDER = Extension(
    "vgpu.shim._libnvrtc",
    sources=["shim/c/nvrtc_forwarder.c"],
    libraries=["dl", "pthread"],
    extra_link_args=["-Wl,-soname,libnvrtc.so.13", "-Wl,--version-script=shim/c/libnvrtc.map"],
    py_limited_api=False,
)

# The round trip's socket calls in C (vgpu/wire.py says why); libzmq is the one pyzmq loaded,
# looked up at import, so nothing links to it here.
ZMQ_WIRE = Extension("vgpu._zmq_wire", sources=["vgpu/c/zmq_wire.c"], libraries=["dl"])

setup(
    package_dir=PACKAGE_DIRS,
    packages=_packages(),
    cffi_modules=["shim/build_driver.py:ffibuilder", "shim/build_runtime.py:ffibuilder"],
    ext_modules=[NVRTC_FORWARDER, ZMQ_WIRE],
)
