"""Builds the shims' C extensions; the project's metadata is in pyproject.toml."""

from setuptools import setup

setup(cffi_modules=["shim/build_driver.py:ffibuilder", "shim/build_runtime.py:ffibuilder"])
