// __half and __nv_bfloat16 arithmetic as cuda_fp16.h / cuda_bf16.h implement it (inline PTX
// with `{ .reg.b16 ...; }` blocks), checked against the same operations done on the host.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cmath>
#include "check.cuh"

const int N = 256;

__global__ void half_math(const float *a, const float *b, float *out, __half *hsum,
                          __nv_bfloat16 *bsum)
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
    // Packed comparisons (set/setp on f16x2, bf16x2), per half and for both halves.
    __half2 h2a = __halves2half2(ha, hb), h2b = __halves2half2(hb, ha);
    __half2 lt = __hlt2(h2a, h2b), eq = __heq2(h2a, h2b);
    out[14 * N + i] = __low2float(lt) + 2 * __high2float(lt) + 4 * __low2float(eq);
    out[15 * N + i] = (float)__hbeq2(h2a, h2b) + 2.0f * (float)__hbge2(h2a, h2b);
    __nv_bfloat162 b2a = {ba, bb}, b2b = {bb, ba};
    __nv_bfloat162 blt = __hlt2(b2a, b2b);
    out[16 * N + i] = __low2float(blt) + 2 * __high2float(blt) + 4 * (float)__hbeq2(b2a, b2b);
    unsigned halves_lt, flags;
    asm("{ .reg .pred p, q; .reg .b32 lo, hi;\n"
        " setp.lt.f16x2 p|q, %2, %3;\n"
        " selp.u32 lo, 1, 0, p; selp.u32 hi, 2, 0, q; or.b32 %1, lo, hi;\n"
        " set.lt.u32.f16x2 %0, %2, %3; }"
        : "=r"(halves_lt), "=r"(flags)
        : "r"(*(unsigned *)&h2a), "r"(*(unsigned *)&h2b));
    out[17 * N + i] = flags + 4 * ((halves_lt & 0xFFFF) == 0xFFFF) + 8 * (halves_lt >> 16 == 0xFFFF);
    unsigned short lt_bits;
    asm("set.lt.f16.f16 %0, %1, %2;" : "=h"(lt_bits)
        : "h"(*(unsigned short *)&ha), "h"(*(unsigned short *)&hb));
    out[18 * N + i] = __half2float(*(__half *)&lt_bits);
    // Half and bfloat16 atomics (bfloat16's is a 16-bit compare-and-swap loop on sm_80).
    atomicAdd(hsum, __float2half(1.0f));
    atomicAdd(bsum, __float2bfloat16(1.0f));
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
    static float a[N], b[N], out[19 * N];
    for (int i = 0; i < N; ++i) {
        a[i] = to_half((i - 128) * 0.37f);
        b[i] = to_half(((i * 37) % 101 - 50) * 0.21f);
    }
    float *da, *db, *dout;
    __half *dhsum;
    __nv_bfloat16 *dbsum;
    CHECK(cudaMalloc(&dhsum, sizeof(__half)));
    CHECK(cudaMalloc(&dbsum, sizeof(__nv_bfloat16)));
    CHECK(cudaMemset(dhsum, 0, sizeof(__half)));
    CHECK(cudaMemset(dbsum, 0, sizeof(__nv_bfloat16)));
    CHECK(cudaMalloc(&da, sizeof(a)));
    CHECK(cudaMalloc(&db, sizeof(b)));
    CHECK(cudaMalloc(&dout, sizeof(out)));
    CHECK(cudaMemcpy(da, a, sizeof(a), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b, sizeof(b), cudaMemcpyHostToDevice));
    half_math<<<1, N>>>(da, db, dout, dhsum, dbsum);
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
        float comparisons[5] = {
            (float)(x < y) + 2 * (float)(y < x) + 4 * (float)(x == y),
            (float)(x == y) + 2 * (float)(x == y),
            (float)(bx < by) + 2 * (float)(by < bx) + 4 * (float)(bx == by),
            (float)(x < y) + 2 * (float)(y < x) + 4 * (float)(x < y) + 8 * (float)(y < x),
            (float)(x < y),
        };
        for (int k = 0; k < 5; ++k) {
            if (out[(14 + k) * N + i] != comparisons[k]) {
                fprintf(stderr, "comparison %d of %g, %g: got %g, expected %g\n", k, x, y,
                        out[(14 + k) * N + i], comparisons[k]);
                return 1;
            }
        }
        for (int k = 0; k < 4; ++k) {
            float got = out[(10 + k) * N + i];
            if (!(std::fabs(got - approximate[k][0]) <= approximate[k][1])) {
                fprintf(stderr, "function %d of %g: got %.9g, expected %.9g\n", k, s, got,
                        approximate[k][0]);
                return 1;
            }
        }
    }
    __half hsum;
    __nv_bfloat16 bsum;
    CHECK(cudaMemcpy(&hsum, dhsum, sizeof(hsum), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&bsum, dbsum, sizeof(bsum), cudaMemcpyDeviceToHost));
    EXPECT(__half2float(hsum) == N && __bfloat162float(bsum) == N);
    printf("half_precision: %d half and bfloat16 results correct\n", 19 * N + 2);
    return 0;
}
