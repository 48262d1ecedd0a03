"""The runtime layer implements exported libcudart symbols only, and at least the ones that
programs built with nvcc need: registration, launch, and the common runtime API."""

from __future__ import annotations

import vgpu.shim.runtime as runtime
from vgpu.api.render_c import RUNTIME_SHIM
from vgpu.api.table import runtime_functions

EXPORTED = {function.symbol for function in runtime_functions()}

# Registration, launch, and the runtime API that common programs call.
REQUIRED = """
__cudaRegisterFatBinary __cudaRegisterFatBinaryEnd __cudaUnregisterFatBinary
__cudaRegisterFunction __cudaRegisterVar __cudaRegisterManagedVar __cudaInitModule
__cudaPushCallConfiguration __cudaPopCallConfiguration __cudaGetKernel __cudaLaunchKernel
__cudaLaunchKernel_ptsz cudaLaunchKernel cudaLaunchKernelExC cudaLaunchCooperativeKernel
cudaGetDeviceCount cudaSetDevice cudaGetDevice cudaGetDeviceProperties cudaDeviceGetAttribute
cudaDeviceSynchronize cudaDeviceReset cudaSetDeviceFlags cudaGetDeviceFlags
cudaDriverGetVersion cudaRuntimeGetVersion cudaDeviceGetLimit cudaDeviceSetLimit
cudaGetLastError cudaPeekAtLastError cudaGetErrorName cudaGetErrorString
cudaMalloc cudaFree cudaMallocHost cudaHostAlloc cudaFreeHost cudaHostRegister
cudaHostUnregister cudaHostGetDevicePointer cudaMallocPitch cudaMemcpy cudaMemcpyAsync
cudaMemcpy2D cudaMemcpy2DAsync cudaMemcpyToSymbol cudaMemcpyFromSymbol cudaMemcpyToSymbolAsync
cudaMemcpyFromSymbolAsync cudaMemset cudaMemsetAsync cudaMemset2D cudaMemGetInfo
cudaMallocAsync cudaFreeAsync cudaPointerGetAttributes
cudaStreamCreate cudaStreamCreateWithFlags cudaStreamCreateWithPriority cudaStreamDestroy
cudaStreamSynchronize cudaStreamQuery cudaStreamWaitEvent cudaStreamAddCallback
cudaLaunchHostFunc cudaEventCreate cudaEventCreateWithFlags cudaEventRecord
cudaEventSynchronize cudaEventQuery cudaEventElapsedTime cudaEventDestroy
cudaOccupancyMaxActiveBlocksPerMultiprocessor
cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags
cudaFuncGetAttributes cudaFuncSetAttribute cudaFuncSetCacheConfig
cudaProfilerStart cudaProfilerStop
""".split()


def _implemented(name: str) -> bool:
    """In Python (shim/runtime/), or in the shim's C (shim/c/)."""
    return callable(getattr(runtime, name, None)) or name in RUNTIME_SHIM.hand_written


def test_every_implementation_is_an_exported_symbol():
    names = {name for name in vars(runtime) if name.startswith(("cuda", "__cuda"))}
    assert names <= EXPORTED, f"not exported by libcudart.so.13: {sorted(names - EXPORTED)}"


def test_everything_issue_4_lists_is_implemented():
    assert set(REQUIRED) <= EXPORTED
    assert [name for name in REQUIRED if not _implemented(name)] == []


def test_per_thread_stream_variants_share_their_base_implementation():
    variants = [s for s in EXPORTED if s.endswith(("_ptsz", "_ptds")) and _implemented(s[:-5])]
    assert "cudaMemcpyAsync_ptsz" in variants and "cudaMemcpy_ptds" in variants
    for symbol in variants:
        assert getattr(runtime, symbol) is getattr(runtime, symbol[:-5])
