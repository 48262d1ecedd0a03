/* The checks of the tests' driver-API programs: a failed call or expectation prints where and
 * why on stderr and makes main() return 1. tests/toolkit.py puts this folder on every C
 * program's include path. */
#ifndef VGPU_DRIVER_CHECKS_H
#define VGPU_DRIVER_CHECKS_H

#include <cuda.h>
#include <stdio.h>

#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    const char *n_ = "?"; cuGetErrorName(r_, &n_); \
    fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", __FILE__, __LINE__, #call, n_, r_); \
    return 1; } } while (0)
#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: expected %s\n", \
    __FILE__, __LINE__, #cond); return 1; } } while (0)

#endif
