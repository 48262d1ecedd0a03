"""What the cuda-python test programs beside this file share: cuda-python's calls return
(error, *values); `check` gives the values, or stops the program with CUDA's name for the
error (what the tests read from its output)."""

import os
import sys

from cuda.bindings import driver as cu


def check(result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        sys.exit(f"{os.path.basename(sys.argv[0])}: CUDA error: {error_name(err)}")
    return values[0] if len(values) == 1 else (values or None)


def error_name(err) -> str:
    name = cu.cuGetErrorName(err)[1]
    return name.decode() if name else str(err)
