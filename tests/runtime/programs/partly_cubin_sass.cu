// Built cubin-only by the test (-gencode arch=compute_80,code=sm_80): no PTX for the emulator.
__global__ void sass_only(int *v)
{
    v[0] = 42;
}

void launch_sass_only(int *v)
{
    sass_only<<<1, 1>>>(v);
}
