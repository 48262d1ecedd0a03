// Kernels of driver_managed.c: they take managed pointers, and one counts into a
// __managed__ variable of the module.
__managed__ int tally = 3;

struct Node {
    int value;
    Node *next;
};

extern "C" __global__ void scale(int *data, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] = data[i] * 3 - 1;
}

extern "C" __global__ void walk(const Node *head, int *sum)
{
    int total = 0;
    for (const Node *node = head; node; node = node->next)
        total += node->value;
    *sum = total;
}

extern "C" __global__ void bump()
{
    atomicAdd(&tally, 1);
}
