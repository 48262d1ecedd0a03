// __half and __nv_bfloat16 arithmetic as cuda_fp16.h / cuda_bf16.h implement it (inline PTX
// with `{ .reg.b16 ...; }` blocks), checked against the same operations done on the host.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cmath>
#include "check.cuh"

const int N = 256;

__global__ void half_math(const float *a, const float *b, float *out)
{
    int i = threadIdx.x;
    __half ha = __float2half(a[i]), hb = __float2half(b[i]);
    __nv_bfloat16 ba = __float2bfloat16(a[i]), bb = __float2bfloat16(b[i]);
    out[0 * N + i] = __half2float(ha + hb);
    out[1 * N + i] = __half2float(ha * hb);
    out[2 * N + i] = __half2float(__hfma(ha, hb, ha));
    out[3 * N + i] = __half2float(__hmax(ha, hb));
    out[4 * N + i] = __bfloat162float(ba + bb);
    out[5 * N + i] = __bfloat162float(ba * bb);
    out[6 * N + i] = __bfloat162float(__hfma(ba, bb, ba));
    out[7 * N + i] = __bfloat162float(__hfma_relu(ba, bb, ba));
    __half2 h2 = __halves2half2(ha, hb);
    __half2 s2 = __hadd2(h2, h2);
    out[8 * N + i] = __low2float(s2) + __high2float(s2);
    out[9 * N + i] = (float)(ha < hb) + 2.0f * (float)(ba < bb);
    // The math functions are approximations built from `{ .reg.b16 ...; }` PTX blocks.
    __half hs = __float2half(a[i] * 0.0625f);
    __nv_bfloat16 bs = __float2bfloat16(a[i] * 0.0625f);
    out[10 * N + i] = __half2float(hexp(hs));
    out[11 * N + i] = __half2float(hcos(hs));
    out[12 * N + i] = __bfloat162float(hexp(bs));
    out[13 * N + i] = __bfloat162float(hsin(bs));
}

// The host's IEEE round-to-nearest-even of a float to half / bfloat16 precision.
static float round_to(float x, int mantissa_bits, int min_exponent)
{
    if (x == 0.0f || std::isnan(x) || std::isinf(x))
        return x;
    int exponent;
    std::frexp(x, &exponent);
    int e = exponent - 1 < min_exponent ? min_exponent : exponent - 1;
    float scale = std::ldexp(1.0f, e - mantissa_bits);
    return std::nearbyint(x / scale) * scale;
}
static float to_half(float x) { return round_to(x, 10, -14); }
static float to_bf16(float x) { return round_to(x, 7, -126); }

// One unit in the last place of `x` at `mantissa_bits` of precision: the approximate math
// functions are allowed that much error.
static float ulp(float x, int mantissa_bits)
{
    int exponent;
    std::frexp(x, &exponent);
    return std::ldexp(1.0f, exponent - 1 - mantissa_bits);
}

int main()
{
    static float a[N], b[N], out[14 * N];
    for (int i = 0; i < N; ++i) {
        a[i] = to_half((i - 128) * 0.37f);
        b[i] = to_half(((i * 37) % 101 - 50) * 0.21f);
    }
    float *da, *db, *dout;
    CHECK(cudaMalloc(&da, sizeof(a)));
    CHECK(cudaMalloc(&db, sizeof(b)));
    CHECK(cudaMalloc(&dout, sizeof(out)));
    CHECK(cudaMemcpy(da, a, sizeof(a), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b, sizeof(b), cudaMemcpyHostToDevice));
    half_math<<<1, N>>>(da, db, dout);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(out, dout, sizeof(out), cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; ++i) {
        float x = a[i], y = b[i], bx = to_bf16(x), by = to_bf16(y);
        float expected[10] = {
            to_half(x + y), to_half(x * y), to_half((float)((double)x * y + x)),
            x > y ? x : y,
            to_bf16(bx + by), to_bf16(bx * by), to_bf16((float)((double)bx * by + bx)),
            std::fmax(to_bf16((float)((double)bx * by + bx)), 0.0f),
            2 * to_half(x + x) / 2 + to_half(y + y), (float)(x < y) + 2.0f * (float)(bx < by),
        };
        expected[8] = to_half(x + x) + to_half(y + y);
        for (int k = 0; k < 10; ++k) {
            if (out[k * N + i] != expected[k]) {
                fprintf(stderr, "result %d of thread %d: got %.9g, expected %.9g (a %g, b %g)\n",
                        k, i, out[k * N + i], expected[k], x, y);
                return 1;
            }
        }
        float s = x * 0.0625f, bs = to_bf16(s);
        float approximate[4][2] = {
            {to_half(std::exp(s)), ulp(std::exp(s), 10)},
            {to_half(std::cos(s)), ulp(std::cos(s), 10)},
            {to_bf16(std::exp(bs)), ulp(std::exp(bs), 7)},
            {to_bf16(std::sin(bs)), ulp(std::sin(bs), 7) + ulp(1.0f, 7) / 64},
        };
        for (int k = 0; k < 4; ++k) {
            float got = out[(10 + k) * N + i];
            if (!(std::fabs(got - approximate[k][0]) <= approximate[k][1])) {
                fprintf(stderr, "function %d of %g: got %.9g, expected %.9g\n", k, s, got,
                        approximate[k][0]);
                return 1;
            }
        }
    }
    printf("half_precision: %d half and bfloat16 results correct\n", 14 * N);
    return 0;
}
