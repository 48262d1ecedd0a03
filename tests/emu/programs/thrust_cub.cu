// thrust and CUB algorithms over device memory: CUB picks its tuning policy from the kernels'
// cudaFuncGetAttributes().ptxVersion, so every algorithm depends on it.
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_scan.cuh>
#include <thrust/device_vector.h>
#include <thrust/reduce.h>
#include <thrust/sort.h>
#include <algorithm>
#include <vector>
#include "check.cuh"

int main()
{
    const int n = 3000;
    std::vector<int> values(n);
    long long expected_sum = 0;
    for (int i = 0; i < n; ++i) {
        values[i] = (i * 7919) % 1001 - 500;
        expected_sum += values[i];
    }
    thrust::device_vector<int> d(values.begin(), values.end());
    int sum = thrust::reduce(d.begin(), d.end());
    EXPECT(sum == expected_sum);

    int *dsum;
    CHECK(cudaMalloc(&dsum, sizeof(int)));
    size_t temp_bytes = 0;
    const int *din = thrust::raw_pointer_cast(d.data());
    CHECK(cub::DeviceReduce::Sum(nullptr, temp_bytes, din, dsum, n));
    void *temp;
    CHECK(cudaMalloc(&temp, temp_bytes));
    CHECK(cub::DeviceReduce::Sum(temp, temp_bytes, din, dsum, n));
    int cub_sum = 0;
    CHECK(cudaMemcpy(&cub_sum, dsum, sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(cub_sum == expected_sum);

    thrust::device_vector<int> scanned(n);
    size_t scan_bytes = 0;
    int *dscan = thrust::raw_pointer_cast(scanned.data());
    CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, din, dscan, n));
    void *scan_temp;
    CHECK(cudaMalloc(&scan_temp, scan_bytes));
    CHECK(cub::DeviceScan::InclusiveSum(scan_temp, scan_bytes, din, dscan, n));
    std::vector<int> prefix(n);
    thrust::copy(scanned.begin(), scanned.end(), prefix.begin());
    int running = 0;
    for (int i = 0; i < n; ++i) {
        running += values[i];
        EXPECT(prefix[i] == running);
    }

    thrust::sort(d.begin(), d.end());
    std::vector<int> sorted(n);
    thrust::copy(d.begin(), d.end(), sorted.begin());
    std::vector<int> expected_sorted = values;
    std::sort(expected_sorted.begin(), expected_sorted.end());
    EXPECT(sorted == expected_sorted);
    printf("thrust_cub: reduce, cub sum, inclusive scan and sort of %d values correct\n", n);
    return 0;
}
