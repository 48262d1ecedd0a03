"""cuGetExportTable as a C program sees it: the tables NVIDIA's runtime uses (context-local
storage with its destructor run at a reset), a slot nobody has seen used, an unknown table."""

from __future__ import annotations

from vgpu_processes import emu_server

SOURCE = r"""
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>

static const CUuuid CUDART_INTERFACE = {{0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a,
                                         0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9}};
static const CUuuid CONTEXT_STORAGE = {{0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11,
                                        0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93}};
static const CUuuid UNKNOWN = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};

typedef void (*destructor)(CUcontext, void *, void *);
typedef CUresult (*put_fn)(CUcontext, void *, void *, destructor);
typedef CUresult (*get_fn)(void **, CUcontext, void *);
typedef CUresult (*slot_fn)(void);

static int destroyed;
static void on_destroy(CUcontext ctx, void *key, void *value)
{
    destroyed += key == (void *)&destroyed && value == (void *)42;
}

int main(void)
{
    const void *const *table;
    CUcontext ctx;
    void *value = NULL;
    cuInit(0);
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);

    if (cuGetExportTable((const void **)&table, &CUDART_INTERFACE) != CUDA_SUCCESS)
        return 1;
    printf("interface bytes %zu\n", (size_t)(uintptr_t)table[0]);
    printf("slot 3 -> %d\n", (int)((slot_fn)table[3])());

    if (cuGetExportTable((const void **)&table, &CONTEXT_STORAGE) != CUDA_SUCCESS)
        return 1;
    printf("put %d\n", (int)((put_fn)table[0])(NULL, &destroyed, (void *)42, on_destroy));
    CUresult got = ((get_fn)table[2])(&value, ctx, &destroyed);
    printf("get %d %ld\n", (int)got, (long)value);
    cuDevicePrimaryCtxReset(0);
    got = ((get_fn)table[2])(&value, ctx, &destroyed);
    printf("destroyed %d, get after reset %d\n", destroyed, (int)got);

    printf("unknown -> %d\n", (int)cuGetExportTable((const void **)&table, &UNKNOWN));
    return 0;
}
"""


def test_export_tables(shim_program, run_program, tmp_path):
    with emu_server(tmp_path) as address:
        result = run_program(shim_program(SOURCE), env={"VGPU_SERVER": address})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "interface bytes 104",  # slot 0: the table's size, 13 slots
        "slot 3 -> 801",
        "put 0",
        "get 0 42",
        "destroyed 1, get after reset 400",  # the reset ran the destructor, once
        "unknown -> 801",
    ]
    assert "slot 3 of the driver's private table CUDART_INTERFACE " \
        "{6bd5fb6c-5bf4-e74a-8987-d93912fd9df9}" in result.stderr, result.stderr
    assert "{01020304-0506-0708-090a-0b0c0d0e0f10}" in result.stderr, result.stderr
