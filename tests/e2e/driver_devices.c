/* Several devices through the driver API (run on `vgpu server --devices 2`): a context on
 * each, told apart; a kernel in device 0's context updating device 1's memory with peer
 * access enabled; peer copies; P2P attributes and misuse, all checked against the host.
 * Usage: driver_devices MANAGED_KERNELS.ptx (its `scale` kernel: x = 3x - 1) */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "driver_checks.h"
#include "test_files.h"

int main(int argc, char **argv) {
    char *ptx = read_file(argc > 1 ? argv[1] : "managed_kernels.ptx");
    EXPECT(ptx != NULL);
    CHECK(cuInit(0));
    int count = 0;
    CHECK(cuDeviceGetCount(&count));
    EXPECT(count == 2);
    CUdevice devices[2];
    CUcontext contexts[2];
    char buses[2][32];
    CUuuid uuids[2];
    for (int d = 0; d < 2; d++) {
        CHECK(cuDeviceGet(&devices[d], d));
        CHECK(cuDeviceGetPCIBusId(buses[d], sizeof buses[d], devices[d]));
        CHECK(cuDeviceGetUuid(&uuids[d], devices[d]));
        CHECK(cuCtxCreate(&contexts[d], NULL, 0, devices[d]));
        CUdevice current = -1;
        CHECK(cuCtxGetDevice(&current));
        EXPECT(current == d);
    }
    EXPECT(strcmp(buses[0], buses[1]) != 0);
    EXPECT(memcmp(&uuids[0], &uuids[1], sizeof uuids[0]) != 0);
    CUdevice none;
    EXPECT(cuDeviceGet(&none, 2) == CUDA_ERROR_INVALID_DEVICE);
    printf("driver_devices: 2 devices with a context each\n");

    /* Device 1's memory, filled there; a kernel of device 0's context updates it. */
    enum { N = 300 };
    int host[N];
    CUdeviceptr theirs, mine;
    for (int i = 0; i < N; i++) host[i] = i;
    CHECK(cuMemAlloc(&theirs, sizeof host));  /* context 1 is current */
    CHECK(cuMemcpyHtoD(theirs, host, sizeof host));
    unsigned int ordinal = 99;
    CHECK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, theirs));
    EXPECT(ordinal == 1);
    CHECK(cuCtxSetCurrent(contexts[0]));
    CHECK(cuMemAlloc(&mine, sizeof host));
    int can = -1;
    CHECK(cuDeviceCanAccessPeer(&can, devices[0], devices[1]));
    EXPECT(can == 1);
    CHECK(cuDeviceCanAccessPeer(&can, devices[0], devices[0]));
    EXPECT(can == 0);
    CHECK(cuCtxEnablePeerAccess(contexts[1], 0));
    EXPECT(cuCtxEnablePeerAccess(contexts[1], 0) == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    EXPECT(cuCtxEnablePeerAccess(contexts[0], 0) == CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    EXPECT(cuCtxEnablePeerAccess(contexts[1], 1) == CUDA_ERROR_INVALID_VALUE);
    CUmodule mod; CUfunction scale;
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&scale, mod, "scale"));
    int n = N;
    void *params[] = {&theirs, &n};
    CHECK(cuLaunchKernel(scale, 3, 1, 1, 128, 1, 1, 0, NULL, params, NULL));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyPeer(mine, contexts[0], theirs, contexts[1], sizeof host));
    int back[N];
    CHECK(cuMemcpyDtoH(back, mine, sizeof back));
    for (int i = 0; i < N; i++) EXPECT(back[i] == 3 * i - 1);
    memset(back, 0, sizeof back);
    CHECK(cuMemcpyPeerAsync(theirs, contexts[1], mine, contexts[0], 16, NULL));
    CHECK(cuCtxSynchronize());
    printf("driver_devices: a kernel updated the peer's memory, peer copies correct\n");

    int value = -1;
    CHECK(cuDeviceGetP2PAttribute(&value, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED,
                                  devices[0], devices[1]));
    EXPECT(value == 1);
    EXPECT(cuDeviceGetP2PAttribute(&value, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED,
                                   devices[0], devices[0]) == CUDA_ERROR_INVALID_DEVICE);
    CHECK(cuCtxDisablePeerAccess(contexts[1]));
    EXPECT(cuCtxDisablePeerAccess(contexts[1]) == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    CHECK(cuMemFree(mine));
    CHECK(cuModuleUnload(mod));
    CHECK(cuCtxDestroy(contexts[0]));
    CHECK(cuCtxSetCurrent(contexts[1]));
    CHECK(cuMemFree(theirs));
    CHECK(cuCtxDestroy(contexts[1]));
    printf("driver_devices: misuse refused with CUDA's errors\n");
    return 0;
}
