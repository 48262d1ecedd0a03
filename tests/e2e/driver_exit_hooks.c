/* CUDA works in exit hooks until the process ends: a hook registered before CUDA started
 * frees memory and synchronizes. Prints "hook <free rc> <sync rc>" from the hook. A child
 * forked and exiting on its own leaves the parent's session alone. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static CUdeviceptr allocation;
static pid_t parent;

static void at_exit(void)
{
    if (getpid() != parent)
        return;
    CUresult freed = cuMemFree(allocation);
    CUresult synchronized = cuCtxSynchronize();
    printf("hook %d %d\n", (int)freed, (int)synchronized);
    fflush(stdout);
}

int main(void)
{
    CUdevice dev;
    CUcontext ctx;

    parent = getpid();
    atexit(at_exit);
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx) || cuMemAlloc(&allocation, 1 << 20))
        return 1;
    printf("allocated\n");
    fflush(stdout);
    pid_t child = fork();
    if (child == 0)
        exit(0);
    int status = -1;
    waitpid(child, &status, 0);
    printf("child exited %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    printf("after the child %d\n", (int)cuCtxSynchronize());
    return 0;
}
