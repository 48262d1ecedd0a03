// Templated kernels: type and non-type template parameters, functors passed by value.
#include "check.cuh"

template <typename T, int BLOCK>
__global__ void axpy(T *y, const T *x, T a, int n)
{
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n)
        y[i] = a * x[i] + y[i];
}

template <typename Op>
__global__ void transform(float *v, int n, Op op)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = op(v[i]);
}

struct Square {
    __device__ float operator()(float x) const { return x * x; }
};

struct Affine {
    float m, b;
    __device__ float operator()(float x) const { return m * x + b; }
};

template <typename T, int BLOCK>
void check_axpy(int n)
{
    T *x = new T[n], *y = new T[n], *dx, *dy;
    for (int i = 0; i < n; ++i) {
        x[i] = (T)i;
        y[i] = (T)1;
    }
    CHECK(cudaMalloc(&dx, n * sizeof(T)));
    CHECK(cudaMalloc(&dy, n * sizeof(T)));
    CHECK(cudaMemcpy(dx, x, n * sizeof(T), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dy, y, n * sizeof(T), cudaMemcpyHostToDevice));
    axpy<T, BLOCK><<<(n + BLOCK - 1) / BLOCK, BLOCK>>>(dy, dx, (T)3, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(y, dy, n * sizeof(T), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i)
        EXPECT(y[i] == (T)(3 * i + 1));
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    delete[] x;
    delete[] y;
}

int main()
{
    check_axpy<int, 64>(200);
    check_axpy<float, 128>(300);
    check_axpy<double, 32>(100);

    const int n = 100;
    float v[n], *dv;
    for (int i = 0; i < n; ++i)
        v[i] = (float)(i % 10);
    CHECK(cudaMalloc(&dv, sizeof(v)));
    CHECK(cudaMemcpy(dv, v, sizeof(v), cudaMemcpyHostToDevice));
    transform<<<2, 64>>>(dv, n, Square());
    transform<<<2, 64>>>(dv, n, Affine{2.0f, 1.0f});
    CHECK(cudaMemcpy(v, dv, sizeof(v), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
        float x = (float)(i % 10);
        EXPECT(v[i] == 2.0f * x * x + 1.0f);
    }
    CHECK(cudaFree(dv));
    printf("templates: int, float, double and functor instantiations correct\n");
    return 0;
}
