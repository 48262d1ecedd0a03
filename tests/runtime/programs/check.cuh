// Checks shared by the runtime test programs: a failed check prints where and why on stderr
// and exits with status 1, so the test sees both the exit code and the reason.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(call)                                                                         \
    do {                                                                                    \
        cudaError_t check_err_ = (call);                                                    \
        if (check_err_ != cudaSuccess) {                                                    \
            fprintf(stderr, "%s:%d: %s failed: %s (%d): %s\n", __FILE__, __LINE__, #call,   \
                    cudaGetErrorName(check_err_), (int)check_err_,                          \
                    cudaGetErrorString(check_err_));                                        \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

#define EXPECT_ERROR(expected, call)                                                        \
    do {                                                                                    \
        cudaError_t check_err_ = (call);                                                    \
        if (check_err_ != (expected)) {                                                     \
            fprintf(stderr, "%s:%d: %s returned %s (%d), expected %s (%d)\n", __FILE__,     \
                    __LINE__, #call, cudaGetErrorName(check_err_), (int)check_err_,         \
                    cudaGetErrorName(expected), (int)(expected));                           \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

#define EXPECT(condition)                                                                   \
    do {                                                                                    \
        if (!(condition)) {                                                                 \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #condition);        \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)
